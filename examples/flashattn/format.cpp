// examples/flashattn/format.cpp — see format.hpp.
#include "format.hpp"

#include <algorithm>
#include <cstdio>

namespace flashattn::cli {

void Table::print(std::ostream& out) const {
    std::vector<std::size_t> width(header_.size(), 0);
    for (std::size_t c = 0; c < header_.size(); ++c) width[c] = header_[c].size();
    for (const auto& row : rows_)
        for (std::size_t c = 0; c < row.size() && c < width.size(); ++c)
            width[c] = std::max(width[c], row[c].size());
    const auto line = [&](const std::vector<std::string>& row) {
        for (std::size_t c = 0; c < width.size(); ++c) {
            const std::string cell = c < row.size() ? row[c] : "";
            const bool numeric = !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) ||
                                                   cell[0] == '-' || cell[0] == '.');
            const std::string pad(width[c] - cell.size(), ' ');
            out << (c ? "  " : "") << (numeric && c > 0 ? pad + cell : cell + pad);
        }
        out << "\n";
    };
    line(header_);
    std::size_t total = 0;
    for (std::size_t w : width) total += w + 2;
    out << std::string(total - 2, '-') << "\n";
    for (const auto& row : rows_) line(row);
}

std::string fixed(double v, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return buf;
}

std::string scientific(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2e", v);
    return buf;
}

std::string human_bytes(std::size_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, ++u;
    char buf[64];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%zu B", bytes);
    else
        std::snprintf(buf, sizeof buf, "%.*f %s", v < 10 ? 2 : 1, v, units[u]);
    return buf;
}

}  // namespace flashattn::cli
