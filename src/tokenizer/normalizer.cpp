#include "tokenizer/normalizer.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace petrel::tokenizer {
namespace {

void read_one(const nlohmann::json& j, std::vector<Normalizer::Form>& forms) {
  const std::string type = j.value("type", "");
  if (type == "NFC") forms.push_back(Normalizer::Form::NFC);
  else if (type == "NFD") forms.push_back(Normalizer::Form::NFD);
  else if (type == "NFKC") forms.push_back(Normalizer::Form::NFKC);
  else if (type == "NFKD") forms.push_back(Normalizer::Form::NFKD);
  else if (type == "Sequence") {
    for (const auto& child : j.at("normalizers")) read_one(child, forms);
  } else {
    throw Error("tokenizer.json: normalizer type '" + type +
                "' is not supported (supported: NFC, NFD, NFKC, NFKD, Sequence of those, null)");
  }
}

int options_for(Normalizer::Form form) {
  switch (form) {
    case Normalizer::Form::NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case Normalizer::Form::NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case Normalizer::Form::NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    case Normalizer::Form::NFKD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
  }
  return 0;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

std::string normalize(std::string_view text, Normalizer::Form form) {
  utf8proc_uint8_t* raw = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &raw,
                              static_cast<utf8proc_option_t>(options_for(form)));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(raw, &std::free);
  if (n < 0) throw Error(std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(raw), static_cast<size_t>(n));
}

}  // namespace

Normalizer Normalizer::from_json(const nlohmann::json& j) {
  Normalizer n;
  if (!j.is_null()) read_one(j, n.forms_);
  return n;
}

// Every normalization form leaves ASCII unchanged, and most input is ASCII.
bool Normalizer::trivially_unchanged(std::string_view text) const { return forms_.empty() || is_ascii(text); }

std::string Normalizer::apply(std::string_view text) const {
  if (trivially_unchanged(text)) return std::string(text);
  std::string out(text);
  for (Form f : forms_) out = normalize(out, f);
  return out;
}

}  // namespace petrel::tokenizer
