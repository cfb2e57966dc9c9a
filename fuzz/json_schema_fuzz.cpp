// Request schemas through the JSON-schema compiler, then text through the grammar. The input is a
// schema (JSON), a NUL byte, then text. Compiling may refuse the schema (SchemaError, or
// petrel::Error for its size), never fail otherwise; every text the grammar accepts whole must be
// JSON, since the answer a client gets is that text.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "grammar/json_schema.h"
#include "grammar/stacks.h"
#include "server/json_fields.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace petrel::grammar;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return -1;
  const auto schema = petrel::server::try_parse_json(input.substr(0, nul));
  if (!schema) return -1;
  Grammar g;
  try {
    g = json_schema_grammar(*schema);
  } catch (const petrel::Error&) {  // SchemaError included
    return 0;
  }
  const std::string_view text = input.substr(nul + 1);
  const Stepper stepper(g);
  const std::vector<Stack> stacks = stepper.advance({{Frame{g.root, 0}}}, text);
  if (!stacks.empty() && stepper.can_end(stacks))
    petrel::fuzz::require(petrel::server::try_parse_json(text, 200).has_value(),
                          "the grammar accepts text that is not JSON: " + std::string(text));
  return 0;
}
