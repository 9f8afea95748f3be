// cuda/host/variants.cu — see cuda/host/variants.hpp.
#include "cuda/host/variants.hpp"

#include <algorithm>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace flashattn::cuda {

std::string requested_variant(const std::string& backend) {
    const char* env = std::getenv(kVariantVariable);
    if (!env || !*env) return {};
    std::stringstream entries(env);
    std::string found;
    for (std::string entry; std::getline(entries, entry, ',');) {
        const std::size_t eq = entry.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size())
            throw std::invalid_argument(std::string(kVariantVariable) + " = '" + env +
                                        "': expected backend=variant[,backend=variant...]");
        if (entry.compare(0, eq, backend) == 0 && eq == backend.size())
            found = entry.substr(eq + 1);
    }
    return found;
}

void require_known_variant(const std::string& backend, const std::string& requested,
                           const std::vector<std::string>& known) {
    if (requested.empty() || std::find(known.begin(), known.end(), requested) != known.end())
        return;
    std::string names;
    for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
    throw std::invalid_argument(std::string(kVariantVariable) + ": " + backend + "=" + requested +
                                ": not a variant of " + backend + " for this problem (known: " +
                                names + ")");
}

bool deterministic_requested() {
    const char* value = std::getenv(kDeterministicVariable);
    if (value == nullptr || std::string(value).empty() || std::string(value) == "0") return false;
    if (std::string(value) == "1") return true;
    throw std::invalid_argument(std::string(kDeterministicVariable) + " = " + value +
                                ": expected 1 (dQ's additions in a fixed order) or 0");
}

}  // namespace flashattn::cuda
