#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace petrel {

MappedFile::MappedFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, path + ": cannot open (" + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat");
  }
  size_ = size_t(st.st_size);
  if (size_ > 0) {
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int err = errno;
    ::close(fd);
    check(m != MAP_FAILED, path + ": mmap failed (" + std::strerror(err) + ")");
    map_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

}  // namespace petrel
