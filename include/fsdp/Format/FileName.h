//===- FileName.h - Names a reader may open inside a directory ---*- C++ -*-===//
#ifndef FSDP_FORMAT_FILENAME_H
#define FSDP_FORMAT_FILENAME_H

#include <string>

namespace fsdp {

/// True for a plain file name, what a file may name another file of its
/// directory by: not empty, no '/', no NUL, not `.` or `..`, at most 255
/// bytes.
inline bool isPlainFileName(const std::string &name) {
  return !name.empty() && name != "." && name != ".." && name.size() <= 255 &&
         name.find('/') == std::string::npos && name.find('\0') == std::string::npos;
}

} // namespace fsdp

#endif // FSDP_FORMAT_FILENAME_H
