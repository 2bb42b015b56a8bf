// ember::Error, the one exception type of every user-facing failure, and EMBER_CHECK, which
// throws it with a fmt-formatted message that starts with the op's name.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace ember {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace ember

// EMBER_CHECK(cond, "op: message {}", args...) throws ember::Error when cond is false.
#define EMBER_CHECK(cond, ...)                          \
  do {                                                  \
    if (!(cond)) [[unlikely]]                           \
      throw ::ember::Error(::fmt::format(__VA_ARGS__)); \
  } while (false)
