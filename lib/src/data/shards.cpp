// data::shard_list and its parts: brace patterns, wids manifests, member names.
#include "ember/data/shards.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::data {
namespace {

constexpr const char* kKind = "wids-shard-index-v1";

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() <= 18 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

/// The alternatives one "{...}" stands for.
std::vector<std::string> alternatives(const std::string& body, const std::string& pattern) {
  const size_t dots = body.find("..");
  if (dots != std::string::npos && body.find(',') == std::string::npos) {
    const std::string a = body.substr(0, dots), b = body.substr(dots + 2);
    EMBER_CHECK_KIND(kConfig, all_digits(a) && all_digits(b),
                     "[data] shard pattern '{}': {{{}}} is not a decimal range such as {{000000..000146}}",
                     pattern, body);
    const int64_t from = std::stoll(a), to = std::stoll(b);
    const size_t width =
        (a.size() > 1 && a[0] == '0') || (b.size() > 1 && b[0] == '0') ? std::max(a.size(), b.size()) : 0;
    const int64_t count = (from <= to ? to - from : from - to) + 1;
    EMBER_CHECK_KIND(kConfig, count <= kMaxExpandedShards,
                     "[data] shard pattern '{}': {{{}}} names {} shards, more than {}", pattern, body, count,
                     kMaxExpandedShards);
    std::vector<std::string> out;
    out.reserve(static_cast<size_t>(count));
    const int64_t step = from <= to ? 1 : -1;
    for (int64_t i = from;; i += step) {
      out.push_back(fmt::format("{:0{}}", i, width));
      if (i == to) break;
    }
    return out;
  }
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    const size_t comma = body.find(',', at);
    out.push_back(body.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

bool is_absolute_url(const std::string& url) {
  return url.rfind('/', 0) == 0 || url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0 ||
         url.rfind("pipe:", 0) == 0;
}

std::string folder_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

}  // namespace

std::vector<std::string> expand_braces(const std::string& pattern) {
  std::vector<std::string> names{""};
  size_t at = 0;
  while (at < pattern.size()) {
    const size_t open = pattern.find('{', at);
    const size_t stray = pattern.find('}', at);
    EMBER_CHECK_KIND(kConfig, stray == std::string::npos || (open != std::string::npos && open < stray),
                     "[data] shard pattern '{}': a '}}' without its '{{'", pattern);
    const std::string literal = pattern.substr(at, open == std::string::npos ? std::string::npos : open - at);
    for (std::string& n : names) n += literal;
    if (open == std::string::npos) break;
    const size_t close = pattern.find('}', open);
    EMBER_CHECK_KIND(kConfig, close != std::string::npos,
                     "[data] shard pattern '{}': a '{{' without its '}}'", pattern);
    const std::string body = pattern.substr(open + 1, close - open - 1);
    EMBER_CHECK_KIND(kConfig, body.find('{') == std::string::npos,
                     "[data] shard pattern '{}': braces inside braces are not supported", pattern);
    const std::vector<std::string> alts = alternatives(body, pattern);
    EMBER_CHECK_KIND(
        kConfig, static_cast<double>(names.size()) * static_cast<double>(alts.size()) <= kMaxExpandedShards,
        "[data] shard pattern '{}' names more than {} shards", pattern, kMaxExpandedShards);
    std::vector<std::string> product;
    product.reserve(names.size() * alts.size());
    for (const std::string& n : names)
      for (const std::string& a : alts) product.push_back(n + a);
    names = std::move(product);
    at = close + 1;
  }
  return names;
}

std::vector<ShardInfo> shard_list(const std::string& spec) {
  // Patterns are separated by "::" (webdataset's separator) or newlines, not
  // by spaces: a pipe: command holds spaces.
  std::vector<std::string> words;
  std::string rest = spec;
  for (size_t at = 0; at <= rest.size();) {
    size_t end = std::min(rest.find("::", at), rest.find('\n', at));
    if (end == std::string::npos) end = rest.size();
    std::string word = rest.substr(at, end - at);
    const size_t b = word.find_first_not_of(" \t\r"), e = word.find_last_not_of(" \t\r");
    if (b != std::string::npos) words.push_back(word.substr(b, e - b + 1));
    at = end + (end < rest.size() && rest[end] == ':' ? 2 : 1);
  }
  EMBER_CHECK_KIND(kConfig, !words.empty(),
                   "[data] no shards named: give a manifest (.json), a pattern such as "
                   "train-{{000000..000146}}.tar, or shard paths separated by ::");
  std::vector<ShardInfo> shards;
  for (const std::string& w : words) {
    if (w.size() > 5 && w.compare(w.size() - 5, 5, ".json") == 0) {
      for (ShardInfo& s : read_manifest(w)) shards.push_back(std::move(s));
      continue;
    }
    for (std::string& name : expand_braces(w)) {
      ShardInfo s;
      s.url = std::move(name);
      shards.push_back(std::move(s));
    }
  }
  return shards;
}

std::vector<ShardInfo> read_manifest(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(core::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    ember::detail::fail(ErrorKind::kData, "[data] {}: not a JSON manifest ({})", path, e.what());
  }
  auto bad = [&](const std::string& what) {
    ember::detail::fail(ErrorKind::kData,
                        "[data] {}: {}; a manifest is wids shard-index JSON (tools/ember shards writes one; "
                        "docs/data.md)",
                        path, what);
  };
  if (!j.is_object()) bad("the top level is not an object");
  if (j.contains("__kind__") && j["__kind__"] != kKind)
    bad(fmt::format("__kind__ is {}, expected \"{}\"", j["__kind__"].dump(), kKind));
  if (!j.contains("shardlist") || !j["shardlist"].is_array()) bad("no \"shardlist\" array");
  std::vector<ShardInfo> shards;
  const std::string base = folder_of(path);
  for (size_t i = 0; i < j["shardlist"].size(); ++i) {
    const nlohmann::json& e = j["shardlist"][i];
    const std::string where = fmt::format("shardlist[{}]", i);
    if (!e.is_object() || !e.contains("url") || !e["url"].is_string() || e["url"].get<std::string>().empty())
      bad(where + " has no \"url\" string");
    ShardInfo s;
    s.url = e["url"].get<std::string>();
    if (!is_absolute_url(s.url)) s.url = base + s.url;
    auto count = [&](const char* key) -> int64_t {
      if (!e.contains(key)) return -1;
      if (!e[key].is_number_integer() || e[key].get<int64_t>() < 0)
        bad(where + "." + key + " is not a count >= 0");
      return e[key].get<int64_t>();
    };
    s.samples = count("nsamples");
    s.bytes = count("filesize");
    if (e.contains("crc32")) {
      const nlohmann::json& c = e["crc32"];
      const std::string text = c.is_string() ? c.get<std::string>() : "";
      if (text.size() != 8 ||
          !std::all_of(text.begin(), text.end(), [](char ch) { return std::isxdigit(ch); }))
        bad(where + ".crc32 is not 8 hex digits");
      s.crc32 = static_cast<uint32_t>(std::stoul(text, nullptr, 16));
    }
    shards.push_back(std::move(s));
  }
  if (shards.empty()) bad("the shard list is empty");
  return shards;
}

void write_manifest(const std::string& path, const std::vector<ShardInfo>& shards, const std::string& name) {
  nlohmann::json list = nlohmann::json::array();
  for (const ShardInfo& s : shards) {
    nlohmann::json e = {{"url", s.url}};
    if (s.samples >= 0) e["nsamples"] = s.samples;
    if (s.bytes >= 0) e["filesize"] = s.bytes;
    if (s.crc32) e["crc32"] = fmt::format("{:08x}", *s.crc32);
    list.push_back(std::move(e));
  }
  const nlohmann::json j = {{"__kind__", kKind}, {"wids_version", 1}, {"name", name}, {"shardlist", list}};
  core::write_file_atomic(path, j.dump(1) + "\n");
}

std::optional<MemberName> split_member_name(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos || dot == base) return std::nullopt;  // no extension, or no key
  MemberName m{name.substr(0, dot), name.substr(dot + 1)};
  std::transform(m.extension.begin(), m.extension.end(), m.extension.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return m;
}

bool is_metadata_member(const std::string& name) {
  // webdataset's skip_meta, r"__[^/]*__($|/)" matched at the start: a top-level
  // "__name__" file or anything in a top-level "__name__/" folder.
  const std::string first = name.substr(0, name.find('/'));
  return first.size() >= 4 && first.rfind("__", 0) == 0 && first.compare(first.size() - 2, 2, "__") == 0;
}

const std::string* ShardSample::find(const std::string& extension) const {
  for (const auto& [ext, bytes] : members)
    if (ext == extension) return &bytes;
  return nullptr;
}

ShardSampleReader::ShardSampleReader(ByteSource& source, TarReaderOptions options)
    : source_(source), tar_(source, options) {}

bool ShardSampleReader::advance() {
  for (;;) {
    pending_ = tar_.next();
    if (!pending_) return false;
    if (is_metadata_member(pending_->name)) continue;
    pending_name_ = split_member_name(pending_->name);
    if (!pending_name_)
      ember::detail::fail(
          ErrorKind::kData,
          "[data] {}: member '{}' (byte {}) has no extension, so it belongs to no sample; a WebDataset "
          "sample's files are KEY.EXT (000123.jpg, 000123.cls): rewrite the shard",
          source_.name(), pending_->name, pending_->offset);
    return true;
  }
}

std::optional<ShardSample> ShardSampleReader::next(bool keep) {
  if (!started_) {
    started_ = true;
    advance();
  }
  if (!pending_) return std::nullopt;
  ShardSample sample;
  sample.key = pending_name_->key;
  sample.offset = pending_->offset;
  do {
    for (const auto& member : sample.members)
      if (member.first == pending_name_->extension)
        ember::detail::fail(ErrorKind::kData,
                            "[data] {}: sample '{}' has two '{}' members (the second at byte {}); "
                            "a sample holds one file per extension: rewrite the shard",
                            source_.name(), sample.key, member.first, pending_->offset);
    sample.members.emplace_back(pending_name_->extension, keep ? tar_.read() : std::string());
  } while (advance() && pending_name_->key == sample.key);
  ++samples_;
  return sample;
}

uint32_t crc32_update(uint32_t crc, const char* data, size_t n) {
  while (n > 0) {
    const auto chunk = static_cast<uInt>(std::min<size_t>(n, size_t{1} << 30));
    crc = static_cast<uint32_t>(::crc32(crc, reinterpret_cast<const Bytef*>(data), chunk));
    data += chunk;
    n -= chunk;
  }
  return crc;
}

bool is_remote_shard(const std::string& url) {
  return url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0 || url.rfind("pipe:", 0) == 0;
}

}  // namespace ember::data
