// Python str operations on UTF-8 text, as chat templates use them (strip, split, title, ...).
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace petrel::jinja::pystr {

// strip/lstrip/rstrip: `chars` absent means whitespace (str.isspace).
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split / str.rsplit; `sep` absent splits on whitespace runs. maxsplit < 0 means no limit.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, long maxsplit, bool from_right);
std::vector<std::string> splitlines(std::string_view s);
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string title(std::string_view s);       // str.title()
std::string capitalize(std::string_view s);  // str.capitalize()
std::string replace(std::string_view s, std::string_view old, std::string_view replacement, long count);
long count(std::string_view s, std::string_view sub);
// Code point index of `sub`, or -1.
long find(std::string_view s, std::string_view sub);
std::string reverse(std::string_view s);
// Python slicing s[start:stop:step] by code points; absent parts take Python's defaults.
std::string slice(std::string_view s, std::optional<long> start, std::optional<long> stop, long step);
// Character-class predicates over all characters (false for the empty string).
bool all_of(std::string_view s, const char* predicate);  // "alpha", "digit", "space", "alnum"
bool is_lower(std::string_view s);
bool is_upper(std::string_view s);

// Python slice index normalisation: the indices a slice of `length` items visits.
std::vector<long> slice_indices(long length, std::optional<long> start, std::optional<long> stop, long step);

}  // namespace petrel::jinja::pystr
