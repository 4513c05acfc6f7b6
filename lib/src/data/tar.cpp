// data::TarReader and data::TarWriter: ustar, GNU and pax, read strictly.
#include "ember/data/tar.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>

#include "core/check.h"
#include "ember/core/file.h"

namespace ember::data {
namespace {

constexpr int64_t kBlock = 512;
/// A GNU long name or a pax record set larger than this is refused (names are
/// at most PATH_MAX, 4 KiB, on Linux; pax records of a file hold a few names).
constexpr int64_t kMaxMetaBytes = int64_t{1} << 20;

// The ustar header's fields: offset and length.
struct Field {
  int offset;
  int length;
};
constexpr Field kName{0, 100};
constexpr Field kMode{100, 8};
constexpr Field kUid{108, 8};
constexpr Field kGid{116, 8};
constexpr Field kSize{124, 12};
constexpr Field kMtime{136, 12};
constexpr Field kChecksum{148, 8};
constexpr int kTypeflag = 156;
constexpr Field kUstarMagic{257, 6};
constexpr Field kVersion{263, 2};
constexpr Field kPrefix{345, 155};

int64_t blocks_of(int64_t n) {
  return (n + kBlock - 1) / kBlock * kBlock;
}

std::string text_of(const char* block, Field f) {
  const char* begin = block + f.offset;
  return std::string(begin, strnlen(begin, static_cast<size_t>(f.length)));
}

/// A header number: octal digits between optional leading spaces/NULs and a
/// space/NUL terminator, or GNU base-256 (first byte 0x80). nullopt: malformed.
std::optional<int64_t> number_of(const char* block, Field f) {
  const auto* p = reinterpret_cast<const unsigned char*>(block + f.offset);
  const int n = f.length;
  if (p[0] & 0x80) {
    if (p[0] != 0x80) return std::nullopt;  // 0xff: negative; anything else is not GNU's
    int64_t v = 0;
    for (int i = 1; i < n; ++i) {
      if (v > (std::numeric_limits<int64_t>::max() >> 8)) return std::nullopt;
      v = (v << 8) | p[i];
    }
    return v;
  }
  int i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  int64_t v = 0;
  int digits = 0;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i, ++digits) {
    if (v > (std::numeric_limits<int64_t>::max() >> 3)) return std::nullopt;
    v = v * 8 + (p[i] - '0');
  }
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\0') return std::nullopt;
  return v;
}

bool is_zero(const char* block) {
  return std::all_of(block, block + kBlock, [](char c) { return c == 0; });
}

/// The stored checksum matches the header's bytes summed with the checksum
/// field as spaces, unsigned (POSIX) or signed (some historic writers).
bool checksum_ok(const char* block) {
  const std::optional<int64_t> stored = number_of(block, kChecksum);
  if (!stored) return false;
  int64_t u = 0, s = 0;
  for (int i = 0; i < kBlock; ++i) {
    const bool in_field = i >= kChecksum.offset && i < kChecksum.offset + kChecksum.length;
    u += in_field ? ' ' : static_cast<unsigned char>(block[i]);
    s += in_field ? ' ' : static_cast<signed char>(block[i]);
  }
  return *stored == u || *stored == s;
}

/// What a pax 'x' record set says about the next member.
struct PaxRecords {
  std::optional<std::string> path;
  std::optional<int64_t> size;
  bool sparse = false;
};

/// Parses "LEN KEY=VALUE\n" records (LEN counts the whole record);
/// returns an error text, empty when well formed.
std::string parse_pax(const std::string& data, PaxRecords& out) {
  size_t at = 0;
  while (at < data.size()) {
    if (data[at] == '\0') break;  // some writers pad the record set with NULs
    size_t len = 0, i = at;
    while (i < data.size() && data[i] >= '0' && data[i] <= '9') {
      if (len > data.size()) return "a record length beyond the record set";
      len = len * 10 + static_cast<size_t>(data[i] - '0');
      ++i;
    }
    if (i == at || i >= data.size() || data[i] != ' ') return "a record without its length";
    if (len < i - at + 2 || len > data.size() - at) return "a record length beyond the record set";
    const size_t end = at + len;  // one past the record's '\n'
    if (data[end - 1] != '\n') return "a record that does not end in a newline";
    const std::string record = data.substr(i + 1, end - 1 - (i + 1));
    const size_t eq = record.find('=');
    if (eq == std::string::npos || eq == 0) return "a record without KEY=";
    const std::string key = record.substr(0, eq);
    const std::string value = record.substr(eq + 1);
    if (key == "path") {
      if (value.empty() || value.find('\0') != std::string::npos) return "an empty or NUL-holding path";
      out.path = value;
    } else if (key == "size") {
      if (value.empty() || value.size() > 18 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return "a size that is not a decimal number below 10^18";
      out.size = std::stoll(value);
    } else if (key.rfind("GNU.sparse.", 0) == 0) {
      out.sparse = true;
    }
    at = end;
  }
  return "";
}

}  // namespace

TarReader::TarReader(ByteSource& source, TarReaderOptions options) : source_(source), options_(options) {
  EMBER_CHECK(options_.max_member_bytes >= 0, "[data::TarReader] max_member_bytes must be >= 0, got {}",
              options_.max_member_bytes);
}

void TarReader::fail(int64_t offset, const std::string& what) const {
  ember::detail::fail(
      ErrorKind::kData,
      "[data] {}: not a readable tar archive at byte {}: {}; the shard is damaged or truncated: "
      "rewrite it (tools/ember shards), or fetch it again",
      source_.name(), offset, what);
}

void TarReader::read_exact(char* out, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    const size_t got = source_.read(out + done, static_cast<size_t>(n - done));
    if (got == 0)
      fail(position_ + done, fmt::format("truncated: {} more bytes expected, the input ended", n - done));
    done += static_cast<int64_t>(got);
  }
  position_ += n;
}

void TarReader::skip(int64_t n) {
  const int64_t done = source_.skip(n);
  if (done < n)
    fail(position_ + done, fmt::format("truncated: {} more bytes expected, the input ended", n - done));
  position_ += n;
}

bool TarReader::read_block(char* block, bool allow_end) {
  int64_t done = 0;
  while (done < kBlock) {
    const size_t got = source_.read(block + done, static_cast<size_t>(kBlock - done));
    if (got == 0) break;
    done += static_cast<int64_t>(got);
  }
  if (done == 0 && allow_end) return false;
  if (done < kBlock) fail(position_ + done, fmt::format("truncated inside a header ({} of 512 bytes)", done));
  position_ += kBlock;
  return true;
}

std::string TarReader::read_payload(int64_t size, const char* what) {
  if (size > kMaxMetaBytes)
    fail(position_ - kBlock,
         fmt::format("a {} of {} bytes (at most {} are accepted)", what, size, kMaxMetaBytes));
  std::string data(static_cast<size_t>(size), '\0');
  read_exact(data.data(), size);
  skip(blocks_of(size) - size);
  return data;
}

std::optional<TarEntry> TarReader::next() {
  if (ended_) return std::nullopt;
  skip(unread_ + padding_);
  unread_ = padding_ = 0;
  member_read_ = true;
  PaxRecords pax;
  std::optional<std::string> long_name;
  int64_t first_offset = -1;  // the member's first header (pax or GNU long name included)
  std::array<char, kBlock> block{};
  for (;;) {
    const int64_t offset = position_;
    const bool pending = first_offset >= 0;  // a long name or pax header waits for its member
    if (!read_block(block.data(), !pending)) {
      ended_ = true;
      return std::nullopt;
    }
    if (is_zero(block.data())) {
      if (pending) fail(offset, "a zero block where the member of a pax or GNU long-name header should be");
      ended_ = true;
      std::array<char, kBlock> second{};
      if (!read_block(second.data(), true)) return std::nullopt;  // one zero block, then the end: accepted
      if (!is_zero(second.data())) fail(offset, "a lone zero block inside the archive");
      return std::nullopt;
    }
    if (!checksum_ok(block.data())) fail(offset, "the header's checksum does not match its bytes");
    for (const Field f : {kMode, kUid, kGid, kMtime})
      if (!number_of(block.data(), f)) fail(offset, "a header number that is neither octal nor base-256");
    const std::optional<int64_t> header_size = number_of(block.data(), kSize);
    if (!header_size) fail(offset, "a size that is neither octal nor base-256");
    if (first_offset < 0) first_offset = offset;
    const char type = block[kTypeflag];
    switch (type) {
      case 'L':
        long_name = read_payload(*header_size, "GNU long name");
        long_name->resize(strnlen(long_name->c_str(), long_name->size()));
        if (long_name->empty()) fail(offset, "an empty GNU long name");
        continue;
      case 'K':
        read_payload(*header_size, "GNU long link name");
        continue;
      case 'x': {
        const std::string records = read_payload(*header_size, "pax header");
        const std::string bad = parse_pax(records, pax);
        if (!bad.empty()) fail(offset, "a pax header with " + bad);
        continue;
      }
      case 'g': {
        PaxRecords global;  // defaults for every later member (times, owners): nothing a sample needs
        const std::string bad = parse_pax(read_payload(*header_size, "pax global header"), global);
        if (!bad.empty()) fail(offset, "a pax global header with " + bad);
        first_offset = -1;
        continue;
      }
      case 'S':
        fail(offset, "a GNU sparse file; write the shard without --sparse");
      case 'M':
        fail(offset, "a multi-volume continuation; join the volumes into one archive");
      default:
        break;
    }
    const int64_t size = pax.size.value_or(*header_size);
    std::string name;
    if (pax.path) {
      name = *pax.path;
    } else if (long_name) {
      name = *long_name;
    } else {
      name = text_of(block.data(), kName);
      const bool posix = std::memcmp(block.data() + kUstarMagic.offset, "ustar\0", 6) == 0 &&
                         std::memcmp(block.data() + kVersion.offset, "00", 2) == 0;
      const std::string prefix = posix ? text_of(block.data(), kPrefix) : "";
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    // A v7 regular file (type NUL) whose name ends in '/' is a directory (as tarfile reads it).
    const bool v7_dir = type == '\0' && !name.empty() && name.back() == '/';
    const bool regular = (type == '0' || type == '\0' || type == '7') && !v7_dir;
    // Links, devices, directories and FIFOs carry no data (as GNU tar and
    // Python's tarfile read them); an unknown type's data is passed over.
    const bool has_data = regular || !(v7_dir || (type >= '1' && type <= '6'));
    if (pax.sparse) fail(offset, "a pax (GNU.sparse) sparse file; write the shard without --sparse");
    if (!regular) {
      if (has_data) skip(blocks_of(size));
      pax = PaxRecords{};
      long_name.reset();
      first_offset = -1;
      continue;
    }
    TarEntry entry;
    entry.name = std::move(name);
    if (entry.name.empty()) fail(offset, "a regular file without a name");
    entry.size = size;
    entry.offset = first_offset;
    unread_ = size;
    padding_ = blocks_of(size) - size;
    member_read_ = false;
    return entry;
  }
}

std::string TarReader::read() {
  EMBER_CHECK(!member_read_, "[data::TarReader] read() once per member, after next() returned one");
  if (unread_ > options_.max_member_bytes)
    ember::detail::fail(
        ErrorKind::kData,
        "[data] {}: a member of {} bytes at byte {}, over the limit of {} bytes; raise the limit "
        "(data.max_member_bytes) if the shard really holds members that large",
        source_.name(), unread_, position_, options_.max_member_bytes);
  std::string bytes(static_cast<size_t>(unread_), '\0');
  read_exact(bytes.data(), unread_);
  unread_ = 0;
  member_read_ = true;
  return bytes;
}

// --- TarWriter ---

namespace {

void put_text(char* block, Field f, std::string_view text) {
  std::memcpy(block + f.offset, text.data(), text.size());
}

void put_octal(char* block, Field f, int64_t value) {
  // length - 1 octal digits, then a NUL.
  const std::string digits = fmt::format("{:0{}o}", value, f.length - 1);
  put_text(block, f, digits);
}

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c > 0 && c < 0x7f; });
}

/// "LEN KEY=VALUE\n", LEN counting itself.
std::string pax_record(std::string_view key, std::string_view value) {
  const size_t rest = key.size() + value.size() + 3;  // ' ', '=', '\n'
  size_t len = rest + 1;
  while (std::to_string(len).size() + rest != len) len = std::to_string(len).size() + rest;
  return fmt::format("{} {}={}\n", len, key, value);
}

std::array<char, kBlock> header(std::string_view name, std::string_view prefix, int64_t size, int64_t mtime,
                                char type) {
  std::array<char, kBlock> h{};
  put_text(h.data(), kName, name);
  put_octal(h.data(), kMode, 0644);
  put_octal(h.data(), kUid, 0);
  put_octal(h.data(), kGid, 0);
  put_octal(h.data(), kSize, size);
  put_octal(h.data(), kMtime, mtime);
  h[kTypeflag] = type;
  std::memcpy(h.data() + kUstarMagic.offset, "ustar\0", 6);
  std::memcpy(h.data() + kVersion.offset, "00", 2);
  put_text(h.data(), kPrefix, prefix);
  std::memset(h.data() + kChecksum.offset, ' ', kChecksum.length);
  int64_t sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  const std::string checksum = fmt::format("{:06o}", sum);
  std::memcpy(h.data() + kChecksum.offset, checksum.data(), 6);
  h[kChecksum.offset + 6] = '\0';
  return h;
}

}  // namespace

TarWriter::TarWriter(std::string path) : path_(std::move(path)), partial_(path_ + ".partial") {
  file_ = std::fopen(partial_.c_str(), "wb");
  if (file_ == nullptr)
    ember::detail::fail(ErrorKind::kData, "[data] cannot write {}: {}", partial_, std::strerror(errno));
  std::setvbuf(file_, nullptr, _IOFBF, size_t{1} << 20);
}

TarWriter::~TarWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    core::remove_file(partial_);
  }
}

void TarWriter::write(const char* data, size_t n) {
  if (std::fwrite(data, 1, n, file_) != n)
    ember::detail::fail(ErrorKind::kData, "[data] cannot write {}: {} (a full disk?)", partial_,
                        std::strerror(errno));
  bytes_ += static_cast<int64_t>(n);
  crc_ = static_cast<uint32_t>(::crc32(crc_, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(n)));
}

void TarWriter::add(std::string_view name, std::string_view bytes, int64_t mtime) {
  EMBER_CHECK(file_ != nullptr, "[data::TarWriter] add() after finish()");
  EMBER_CHECK(!name.empty() && name.find('\0') == std::string_view::npos,
              "[data::TarWriter] a member needs a name without NUL bytes");
  EMBER_CHECK(mtime >= 0 && mtime < (int64_t{1} << 33), "[data::TarWriter] mtime {} out of ustar's range",
              mtime);
  const auto size = static_cast<int64_t>(bytes.size());
  std::string_view ustar_name = name, prefix;
  std::string pax;
  if (!is_ascii(name)) {
    pax += pax_record("path", name);
    ustar_name = "non-ascii-name";
  } else if (name.size() > 100) {
    // ustar's split: a prefix of at most 155 bytes at a '/', a name of at most 100.
    const size_t cut = name.rfind('/', std::min<size_t>(155, name.size() - 1));
    if (cut != std::string_view::npos && cut > 0 && name.size() - cut - 1 <= 100 &&
        name.size() - cut - 1 > 0) {
      prefix = name.substr(0, cut);
      ustar_name = name.substr(cut + 1);
    } else {
      pax += pax_record("path", name);
      ustar_name = name.substr(name.size() - std::min<size_t>(name.size(), 100));
    }
  }
  const bool big = size >= (int64_t{1} << 33);  // 11 octal digits hold < 8 GiB
  if (big) pax += pax_record("size", std::to_string(size));
  if (!pax.empty()) {
    const auto x = header("././@PaxHeader", "", static_cast<int64_t>(pax.size()), mtime, 'x');
    write(x.data(), x.size());
    write(pax.data(), pax.size());
    const std::array<char, kBlock> zeros{};
    write(zeros.data(), static_cast<size_t>(blocks_of(static_cast<int64_t>(pax.size())) - pax.size()));
  }
  const auto h = header(ustar_name, prefix, big ? 0 : size, mtime, '0');
  write(h.data(), h.size());
  write(bytes.data(), bytes.size());
  const std::array<char, kBlock> zeros{};
  write(zeros.data(), static_cast<size_t>(blocks_of(size) - size));
}

void TarWriter::finish() {
  EMBER_CHECK(file_ != nullptr, "[data::TarWriter] finish() twice");
  const std::array<char, 2 * kBlock> zeros{};
  write(zeros.data(), zeros.size());
  const bool flushed = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!flushed || !closed) {
    core::remove_file(partial_);
    ember::detail::fail(ErrorKind::kData, "[data] cannot write {}: {} (a full disk?)", partial_,
                        std::strerror(err));
  }
  core::rename_path(partial_, path_);
}

}  // namespace ember::data
