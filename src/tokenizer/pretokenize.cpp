#include "tokenizer/pretokenize.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace petrel::tokenizer {
namespace {

// GPT-2's pattern, which ByteLevel applies when "use_regex" is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t begin, end;
  bool matched;
};

SplitBehavior parse_behavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::Removed;
  if (name == "Isolated") return SplitBehavior::Isolated;
  if (name == "MergedWithPrevious") return SplitBehavior::MergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::MergedWithNext;
  if (name == "Contiguous") return SplitBehavior::Contiguous;
  throw Error("tokenizer.json: pre_tokenizer Split behavior '" + name + "' is not supported");
}

SplitStep parse_split(const nlohmann::json& j) {
  if (j.value("invert", false))
    throw Error("tokenizer.json: pre_tokenizer Split with \"invert\": true is not supported");
  SplitStep step;
  step.behavior = parse_behavior(j.at("behavior").get<std::string>());
  const auto& pattern = j.at("pattern");
  if (pattern.contains("Regex")) {
    step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), "tokenizer.json pre_tokenizer Split");
  } else if (pattern.contains("String")) {
    step.literal = pattern["String"].get<std::string>();
  } else {
    throw Error("tokenizer.json: pre_tokenizer Split pattern must be {\"Regex\": ...} or {\"String\": ...}");
  }
  return step;
}

ByteLevelStep parse_byte_level(const nlohmann::json& j) {
  ByteLevelStep step;
  step.add_prefix_space = j.value("add_prefix_space", true);
  step.use_regex = j.value("use_regex", true);
  return step;
}

void read_steps(const nlohmann::json& j, std::vector<std::variant<SplitStep, ByteLevelStep>>& steps) {
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& child : j.at("pretokenizers")) read_steps(child, steps);
  } else if (type == "Split") {
    steps.emplace_back(parse_split(j));
  } else if (type == "ByteLevel") {
    steps.emplace_back(parse_byte_level(j));
  } else {
    throw Error("tokenizer.json: pre_tokenizer type '" + type +
                "' is not supported (supported: Split, ByteLevel, Sequence of those)");
  }
}

// Matched and unmatched spans covering `text`, in order.
std::vector<Span> find_spans(const SplitStep& step, std::string_view text) {
  std::vector<Span> spans;
  size_t prev = 0;
  auto add_match = [&](size_t b, size_t e) {
    if (b > prev) spans.push_back({prev, b, false});
    spans.push_back({b, e, true});
    prev = e;
  };
  if (step.regex) {
    for (auto m = step.regex->find(text, 0); m; m = step.regex->find(text, m->second)) add_match(m->first, m->second);
  } else if (!step.literal.empty()) {
    for (size_t at = text.find(step.literal); at != std::string_view::npos; at = text.find(step.literal, prev))
      add_match(at, at + step.literal.size());
  }
  if (prev < text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

// Applies the behavior to the spans: which text becomes a piece, and what merges with what.
std::vector<Span> group_spans(const std::vector<Span>& spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      return spans;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.matched) out.push_back(s);
      return out;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& s : spans) {
        if (s.matched && !previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.matched;
      }
      return out;
    case SplitBehavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->matched && !previous_match && !out.empty()) out.back().begin = it->begin;
        else out.push_back(*it);
        previous_match = it->matched;
      }
      return {out.rbegin(), out.rend()};
    case SplitBehavior::Contiguous:
      for (const Span& s : spans) {
        if (s.matched == previous_match && !out.empty()) out.back().end = s.end;
        else out.push_back(s);
        previous_match = s.matched;
      }
      return out;
  }
  return out;
}

void apply_split(const SplitStep& step, std::string_view piece, std::vector<std::string_view>& out) {
  for (const Span& s : group_spans(find_spans(step, piece), step.behavior))
    if (s.end > s.begin) out.push_back(piece.substr(s.begin, s.end - s.begin));
}

void apply_byte_level(const ByteLevelStep& step, std::string_view piece, std::vector<std::string_view>& out,
                      std::deque<std::string>& arena) {
  if (step.add_prefix_space && (piece.empty() || piece.front() != ' ')) {
    arena.push_back(" " + std::string(piece));
    piece = arena.back();
  }
  if (!step.use_regex) {
    if (!piece.empty()) out.push_back(piece);
    return;
  }
  static const SplitStep gpt2{std::make_shared<Regex>(kGpt2Pattern, "ByteLevel pre_tokenizer"), "",
                              SplitBehavior::Isolated};
  apply_split(gpt2, piece, out);
}

}  // namespace

PreTokenizer PreTokenizer::from_json(const nlohmann::json& j) {
  PreTokenizer p;
  if (!j.is_null()) read_steps(j, p.steps_);
  return p;
}

bool PreTokenizer::has_byte_level() const {
  for (const auto& step : steps_)
    if (std::holds_alternative<ByteLevelStep>(step)) return true;
  return false;
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& words,
                         std::deque<std::string>& arena) const {
  std::vector<std::string_view> current{text}, next;
  for (const auto& step : steps_) {
    next.clear();
    for (std::string_view piece : current) {
      if (const auto* s = std::get_if<SplitStep>(&step)) apply_split(*s, piece, next);
      else apply_byte_level(std::get<ByteLevelStep>(step), piece, next, arena);
    }
    current.swap(next);
  }
  for (std::string_view w : current)
    if (!w.empty()) words.push_back(w);
}

}  // namespace petrel::tokenizer
