// examples/flashattn/number_options.hpp — how the command line reads numbers: exactly as written,
// and refused, with the text as given, when they do not fit (never clamped, never rounded to
// something else such as inf or 0).
//
// CLI11 alone reads integers with strtoll: "18446744073709551617" becomes INT64_MAX without a
// word, and "010" is octal 8. whole_number<T>() runs first (a CLI11 transform on the option's
// text) and leaves CLI11 only plain decimal text that T holds.
#pragma once

#include <CLI/CLI.hpp>
#include <charconv>
#include <limits>
#include <string>

namespace flashattn::cli {

// For an integer option of type T: a decimal integer that T holds ("+12" and "007" are 12 and 7).
// Refuses, naming the text, "1e20", "0x10", "12abc", "" and anything beyond T's range.
template <class T>
CLI::Validator whole_number() {
    return CLI::Validator(
        [](std::string& text) -> std::string {
            const char* begin = text.data() + (text.size() > 1 && text[0] == '+' ? 1 : 0);
            const char* end = text.data() + text.size();
            T value{};
            const auto [stop, error] = std::from_chars(begin, end, value);
            const std::string range = std::to_string(std::numeric_limits<T>::min()) + " to " +
                                      std::to_string(std::numeric_limits<T>::max());
            if (error == std::errc::result_out_of_range && stop == end)
                return text + " is beyond the integers this option holds (" + range + ")";
            if (error != std::errc() || stop != end || begin == end)
                return text + " is not a whole number in decimal digits (" + range + ")";
            text = std::to_string(value);  // what CLI11 then reads: no octal, no sign
            return {};
        },
        /*validator_desc=*/"", /*validator_name=*/"whole number");
}

// For a fraction option: a number in (0, 1], refused naming the text as given.
CLI::Validator fraction();

// Reads a floating-point option's text as the float32 it is used as. Refuses, with
// std::invalid_argument naming `option` and the text as given: text that is not a number, a value that is not finite, one beyond float32's range ("1e39", finite as a double, is inf as a
// float), and a nonzero value that float32 rounds to 0.
float parse_float32(const std::string& option, const std::string& text);

}  // namespace flashattn::cli
