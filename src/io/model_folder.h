// What a command was given where it expects a model folder, said plainly when it is not one: a
// path that does not exist (a Hugging Face model id among them, with the command that downloads
// it), a file, or a folder without the file the command reads first.
#pragma once
#include <string>

namespace petrel {

// Throws petrel::Error unless `dir` is a folder holding `needed` (e.g. "config.json"); `expected`
// says what the folder should be ("a checkpoint folder containing config.json and *.safetensors").
void check_model_folder(const std::string& dir, const std::string& needed, const std::string& expected);
// The same for a checkpoint folder: config.json and *.safetensors; a .gguf file passes too.
void check_checkpoint_folder(const std::string& dir);

}  // namespace petrel
