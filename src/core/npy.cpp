#include "core/npy.h"

#include <cstring>
#include <fstream>
#include <regex>

#include "core/error.h"

namespace petrel {

void write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  int64_t n = 1;
  for (int64_t d : shape) {
    dims += std::to_string(d) + ", ";
    n *= d;
  }
  if (shape.size() > 1) dims.resize(dims.size() - 1);  // "(3, 4)" but "(3,)"
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t total = 10 + header.size() + 1;
  header += std::string((64 - total % 64) % 64, ' ') + "\n";  // pad so data starts 64-aligned
  std::ofstream out(path, std::ios::binary);
  check(bool(out), path + ": cannot open for writing");
  const uint16_t len = uint16_t(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&len), 2);
  out.write(header.data(), std::streamsize(header.size()));
  out.write(reinterpret_cast<const char*>(data), std::streamsize(n * sizeof(float)));
  check(bool(out), path + ": write failed");
}

NpyArray read_npy_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  check(bool(in), path + ": cannot open");
  char magic[10];
  in.read(magic, 10);
  check(in && std::memcmp(magic, "\x93NUMPY", 6) == 0, path + ": not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    hlen = uint8_t(magic[8]) | (uint32_t(uint8_t(magic[9])) << 8);
  } else {
    char more[2];
    in.read(more, 2);
    hlen = uint8_t(magic[8]) | (uint32_t(uint8_t(magic[9])) << 8) | (uint32_t(uint8_t(more[0])) << 16) |
           (uint32_t(uint8_t(more[1])) << 24);
  }
  std::string header(hlen, '\0');
  in.read(header.data(), hlen);
  check(header.find("'<f4'") != std::string::npos, path + ": expected dtype '<f4' in header " + header);
  check(header.find("'fortran_order': False") != std::string::npos, path + ": expected C order");
  NpyArray a;
  std::smatch m;
  check(std::regex_search(header, m, std::regex("'shape': \\(([0-9, ]*)\\)")), path + ": no shape in header");
  const std::string dims = m[1];
  std::regex num("[0-9]+");
  int64_t n = 1;
  for (auto it = std::sregex_iterator(dims.begin(), dims.end(), num); it != std::sregex_iterator(); ++it) {
    a.shape.push_back(std::stoll(it->str()));
    n *= a.shape.back();
  }
  a.data.resize(size_t(n));
  in.read(reinterpret_cast<char*>(a.data.data()), std::streamsize(n * sizeof(float)));
  check(bool(in), path + ": truncated data");
  return a;
}

}  // namespace petrel
