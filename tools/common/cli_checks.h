// Numeric option checks shared by nfc and nfrun. They replace CLI11's
// NonNegativeNumber / PositiveNumber / Range, whose messages print the
// range's upper end (the largest double, 309 digits) and call a word a value
// "not in range": here a bad value reads "--max-tokens: expected a number
// >= 0, got 'abc'".
#ifndef NF_TOOLS_CLI_CHECKS_H
#define NF_TOOLS_CLI_CHECKS_H

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace nf::cli {

/// The finite number that all of `s` spells, if it spells one.
inline std::optional<double> parseNumber(const std::string &s) {
  if (s.empty())
    return std::nullopt;
  char *end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v))
    return std::nullopt;
  return v;
}

/// A check that accepts the numbers `ok` accepts; `name` shows in --help
/// (INT:NONNEGATIVE), `expected` in the error.
inline CLI::Validator numberCheck(const std::string &name,
                                  const std::string &expected,
                                  std::function<bool(double)> ok) {
  return CLI::Validator(
      [expected, ok](std::string &s) -> std::string {
        const std::optional<double> v = parseNumber(s);
        if (v && ok(*v))
          return {};
        return "expected " + expected + ", got '" + s + "'";
      },
      name);
}

inline const CLI::Validator NonNegative = numberCheck(
    "NONNEGATIVE", "a number >= 0", [](double v) { return v >= 0; });
inline const CLI::Validator Positive =
    numberCheck("POSITIVE", "a number > 0", [](double v) { return v > 0; });

/// Numbers in [lo, hi], written as given ("0", "1", "65535").
inline CLI::Validator Between(const std::string &lo, const std::string &hi) {
  const double l = std::strtod(lo.c_str(), nullptr),
               h = std::strtod(hi.c_str(), nullptr);
  return numberCheck("in [" + lo + ", " + hi + "]",
                     "a number in [" + lo + ", " + hi + "]",
                     [l, h](double v) { return v >= l && v <= h; });
}

} // namespace nf::cli

#endif // NF_TOOLS_CLI_CHECKS_H
