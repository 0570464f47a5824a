//===- TestSupport.h - Small helpers the unit tests share -------*- C++ -*-===//
//
// Float bit patterns, hex fixtures and running a checker script with its
// output captured: written once for every test file that needs them.
//
//===----------------------------------------------------------------------===//
#ifndef FSDP_UNITTESTS_TESTSUPPORT_H
#define FSDP_UNITTESTS_TESTSUPPORT_H

#include <sys/wait.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace fsdp_test {

inline uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

/// "0a1b..." -> the bytes it spells.
inline std::string fromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

/// Runs `command` through the shell with stdout and stderr sent to the file
/// `log` (removed afterwards); returns the exit code (-1 when it did not
/// exit) and the output.
inline std::pair<int, std::string> runCapturingOutput(const std::string &command,
                                                      const std::string &log) {
  int status = std::system((command + " > " + log + " 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream text;
  text << in.rdbuf();
  std::remove(log.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
}

} // namespace fsdp_test

#endif // FSDP_UNITTESTS_TESTSUPPORT_H
