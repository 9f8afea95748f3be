// examples/flashattn/format.hpp — small text-table and number formatting for the CLI's reports.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "common/problem.hpp"

namespace flashattn::cli {

// A table printed with aligned columns (numbers right-aligned).
class Table {
public:
    explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
    void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
    void print(std::ostream& out) const;

private:
    std::vector<std::string> header_;
    std::vector<std::vector<std::string>> rows_;
};

std::string fixed(double v, int decimals);
std::string scientific(double v);
std::string human_bytes(std::size_t bytes);  // "0 B", "12.0 KiB", "1.00 GiB"

}  // namespace flashattn::cli
