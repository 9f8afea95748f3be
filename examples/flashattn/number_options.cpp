// examples/flashattn/number_options.cpp — see number_options.hpp.
#include "number_options.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>

namespace flashattn::cli {
namespace {

struct Decimal {
    double value;
    bool underflow;  // a nonzero number that a double rounds to 0 ("1e-400")
};

// The whole text as a double (strtod's syntax), or nothing.
std::optional<Decimal> read_double(const std::string& text) {
    if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
    char* end = nullptr;
    errno = 0;
    const double value = std::strtod(text.c_str(), &end);
    if (end != text.c_str() + text.size()) return std::nullopt;
    return Decimal{value, errno == ERANGE && value == 0.0};
}

std::string shortest(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

}  // namespace

CLI::Validator fraction() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const std::optional<Decimal> d = read_double(text);
            if (!d || d->underflow || !(d->value > 0.0 && d->value <= 1.0))
                return text + " is not a number in (0, 1]";
            return {};
        },
        /*validator_desc=*/"", /*validator_name=*/"fraction");
}

float parse_float32(const std::string& option, const std::string& text) {
    const auto refuse = [&](const std::string& why) {
        throw std::invalid_argument(option + " = " + text + ": " + why);
    };
    const std::optional<Decimal> d = read_double(text);
    if (!d) refuse("not a number");
    if (std::isnan(d->value)) refuse("must be a number, not NaN");
    if (std::isinf(d->value)) refuse("must be finite");
    const float f = static_cast<float>(d->value);
    if (std::isinf(f))
        refuse("beyond float32's range (magnitude at most " +
               shortest(std::numeric_limits<float>::max()) + ")");
    if (f == 0.0f && (d->value != 0.0 || d->underflow))
        refuse("too small for float32: it would be 0 (the smallest nonzero magnitude is " +
               shortest(std::numeric_limits<float>::denorm_min()) + ")");
    return f;
}

}  // namespace flashattn::cli
