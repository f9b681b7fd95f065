// `pulse decode MODEL.gguf` (run the in-process decoder directly, like llama.cpp's CLI) and
// `pulse gguf make-demo [FILE]` (write the random-weight demo model).
#pragma once

#include <string>
#include <vector>

namespace pulse::cli {

int cmd_decode(const std::vector<std::string>& args);
int cmd_gguf(const std::vector<std::string>& args);

}  // namespace pulse::cli
