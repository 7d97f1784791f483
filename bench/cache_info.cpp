// fattn-bench — data caches from sysfs or sysconf (see cache_info.hpp).
#include "cache_info.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

namespace fattn_bench {
namespace {

constexpr int kHighestLevel = 3;
constexpr std::int64_t kKibibyte = 1024;

std::string read_line(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// "32K", "1024K", "32M" → bytes; 0 if unreadable.
std::int64_t parse_size(const std::string& text) {
  std::istringstream in(text);
  std::int64_t value = 0;
  char unit = 0;
  if (!(in >> value)) return 0;
  in >> unit;
  if (unit == 'K') return value * kKibibyte;
  if (unit == 'M') return value * kKibibyte * kKibibyte;
  return value;
}

std::vector<CacheLevel> from_sysfs() {
  std::vector<CacheLevel> caches;
  for (int index = 0;; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    const std::string level = read_line(dir + "/level");
    if (level.empty()) break;
    const std::string type = read_line(dir + "/type");
    if (type == "Instruction") continue;
    CacheLevel c;
    c.level = std::stoi(level);
    c.bytes = parse_size(read_line(dir + "/size"));
    c.shared_by_cpus = count_cpu_list(read_line(dir + "/shared_cpu_list"));
    c.source = "sysfs";
    if (c.level <= kHighestLevel && c.bytes > 0) caches.push_back(c);
  }
  std::sort(caches.begin(), caches.end(),
            [](const CacheLevel& a, const CacheLevel& b) { return a.level < b.level; });
  return caches;
}

std::vector<CacheLevel> from_sysconf() {
  const int names[] = {_SC_LEVEL1_DCACHE_SIZE, _SC_LEVEL2_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE};
  std::vector<CacheLevel> caches;
  for (int level = 1; level <= kHighestLevel; ++level) {
    const long bytes = sysconf(names[level - 1]);
    // sysconf does not say which CPUs share a cache: L3 is taken as shared by all.
    const int shared = level == kHighestLevel ? static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)) : 1;
    if (bytes > 0) caches.push_back({level, bytes, std::max(shared, 1), "sysconf"});
  }
  return caches;
}

}  // namespace

int count_cpu_list(const std::string& list) {
  int count = 0;
  std::istringstream in(list);
  std::string range;
  while (std::getline(in, range, ',')) {
    const auto dash = range.find('-');
    try {
      if (dash == std::string::npos) {
        std::stoi(range);
        ++count;
      } else {
        count += std::stoi(range.substr(dash + 1)) - std::stoi(range.substr(0, dash)) + 1;
      }
    } catch (const std::exception&) {
      return 1;
    }
  }
  return std::max(count, 1);
}

std::vector<CacheLevel> detect_data_caches() {
  std::vector<CacheLevel> caches = from_sysfs();
  return caches.empty() ? from_sysconf() : caches;
}

}  // namespace fattn_bench
