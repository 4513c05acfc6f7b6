// data::TarReader and data::TarWriter: round trips, the three formats' own
// constructs made byte by byte (ustar prefix, GNU long names and base-256
// sizes, pax records), and damaged archives. Archives written by Python's
// tarfile and GNU tar are read in tests/data/shards_interop_test.py.
#include <ember/core/error.h>
#include <ember/core/file.h>
#include <ember/data/tar.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <numeric>

#include "train/test_task.h"

using namespace ember;
using test_util::error_of;

namespace {

struct Member {
  std::string name;
  std::string bytes;
};

/// Every member; `to_the_end`: the archive's last byte is its end marker's.
std::vector<Member> read_all(const std::string& archive, bool to_the_end = true) {
  data::MemorySource source(archive, "test.tar");
  data::TarReader reader(source);
  std::vector<Member> out;
  while (auto e = reader.next()) {
    Member m{e->name, reader.read()};
    EXPECT_EQ(static_cast<int64_t>(m.bytes.size()), e->size) << e->name;
    out.push_back(std::move(m));
  }
  if (to_the_end) {
    EXPECT_EQ(reader.position(), static_cast<int64_t>(archive.size()));
  }
  return out;
}

std::string bytes_of(int n, int seed) {
  std::string s(static_cast<size_t>(n), '\0');
  for (int i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed * 17) & 0xff);
  return s;
}

/// One 512-byte header as the three formats write it, checksum included:
/// `size_field` is the 12 bytes of the size field as given (octal text or base-256).
std::string header(const std::string& name, std::string size_field, char type, bool gnu_magic = false,
                   const std::string& prefix = "") {
  std::array<char, 512> h{};
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::memcpy(h.data() + 100, "0000644", 8);
  std::memcpy(h.data() + 108, "0000000", 8);
  std::memcpy(h.data() + 116, "0000000", 8);
  size_field.resize(12, '\0');
  std::memcpy(h.data() + 124, size_field.data(), 12);
  std::memcpy(h.data() + 136, "00000000000", 12);
  h[156] = type;
  if (gnu_magic) {
    std::memcpy(h.data() + 257, "ustar  \0", 8);
  } else {
    std::memcpy(h.data() + 257,
                "ustar\0"
                "00",
                8);
  }
  std::memcpy(h.data() + 345, prefix.data(), std::min<size_t>(prefix.size(), 155));
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return std::string(h.data(), h.size());
}

std::string octal(int64_t n) {
  return fmt::format("{:011o}", n);
}

std::string padded(const std::string& data) {
  return data + std::string((512 - data.size() % 512) % 512, '\0');
}

const std::string kEnd(1024, '\0');

std::string written(const std::vector<Member>& members) {
  const std::string dir = test_util::temp_dir("tar_written");
  {
    data::TarWriter w(dir + "/a.tar");
    for (const Member& m : members) w.add(m.name, m.bytes);
    w.finish();
  }
  return core::read_file(dir + "/a.tar");
}

}  // namespace

TEST(Tar, WriterRoundTripsNamesUstarCannotHold) {
  const std::string long_dir = std::string(120, 'd') + "/" + std::string(90, 'f') + ".jpg";  // a prefix split
  const std::string long_flat = std::string(180, 'x') + ".cls";                              // pax path
  const std::vector<Member> members = {{"000000.jpg", bytes_of(1000, 1)},
                                       {"000000.cls", "7"},
                                       {"000001.jpg", bytes_of(512, 2)},
                                       {"000001.cls", ""},
                                       {std::string(100, 'n'), bytes_of(3, 3)},
                                       {long_dir, bytes_of(513, 4)},
                                       {long_flat, bytes_of(1, 5)},
                                       {"d\xc3\xa9j\xc3\xa0/vu.txt", "caf\xc3\xa9"}};
  const std::string archive = written(members);
  const std::vector<Member> back = read_all(archive);
  ASSERT_EQ(back.size(), members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    EXPECT_EQ(back[i].name, members[i].name);
    EXPECT_EQ(back[i].bytes, members[i].bytes) << members[i].name;
  }
  // Members the caller does not read are skipped; offsets are the first header's.
  data::MemorySource source(archive, "a.tar");
  data::TarReader reader(source);
  int64_t last = -1;
  int n = 0;
  while (auto e = reader.next()) {
    EXPECT_GT(e->offset, last);
    EXPECT_EQ(e->offset % 512, 0);
    last = e->offset;
    ++n;
  }
  EXPECT_EQ(n, static_cast<int>(members.size()));
}

TEST(Tar, WriterPublishesOnlyFinishedArchives) {
  const std::string dir = test_util::temp_dir("tar_partial");
  {
    data::TarWriter w(dir + "/s.tar");
    w.add("a.txt", "x");
    EXPECT_TRUE(core::is_file(dir + "/s.tar.partial"));
    EXPECT_FALSE(core::is_file(dir + "/s.tar"));
  }  // destroyed unfinished: nothing left behind
  EXPECT_FALSE(core::is_file(dir + "/s.tar.partial"));
  EXPECT_FALSE(core::is_file(dir + "/s.tar"));
  data::TarWriter w(dir + "/s.tar");
  w.add("a.txt", "x");
  w.finish();
  EXPECT_TRUE(core::is_file(dir + "/s.tar"));
  EXPECT_EQ(static_cast<int64_t>(core::read_file(dir + "/s.tar").size()), w.bytes());
}

TEST(Tar, ReadsUstarPrefixGnuLongNamesAndBase256Sizes) {
  const std::string long_name = std::string(150, 'g') + "/sample.png";
  std::string base256(12, '\0');
  base256[0] = static_cast<char>(0x80);
  base256[11] = 5;  // 5 bytes
  const std::string archive =
      header("img.jpg", octal(3), '0', false, "some/dir") + padded("abc") +
      header("././@LongLink", octal(long_name.size() + 1), 'L', true) + padded(long_name + '\0') +
      header("truncated-name", octal(4), '0', true) + padded("wxyz") + header("big.bin", base256, '0', true) +
      padded("12345") + header("dir/", octal(0), '5') + header("link", octal(0), '2') +
      header("hard", octal(0), '1') + header("old.txt", octal(2), '\0') + padded("ok") + kEnd;
  const std::vector<Member> back = read_all(archive);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_EQ(back[0].name, "some/dir/img.jpg");
  EXPECT_EQ(back[0].bytes, "abc");
  EXPECT_EQ(back[1].name, long_name);  // the GNU long name, not the header's
  EXPECT_EQ(back[1].bytes, "wxyz");
  EXPECT_EQ(back[2].name, "big.bin");
  EXPECT_EQ(back[2].bytes, "12345");
  EXPECT_EQ(back[3].name, "old.txt");  // a v7 regular file (type NUL)
  // GNU magic: the prefix field is not a prefix (GNU keeps times there).
  const std::string gnu = header("x.txt", octal(1), '0', true, "atime-bytes") + padded("1") + kEnd;
  EXPECT_EQ(read_all(gnu).at(0).name, "x.txt");
}

TEST(Tar, ReadsPaxPathAndSizeAndSkipsGlobalRecords) {
  // "LEN KEY=VALUE\n", LEN counting the whole record.
  auto record = [](const std::string& key, const std::string& value) {
    const size_t rest = key.size() + value.size() + 3;
    size_t len = rest + 1;
    while (std::to_string(len).size() + rest != len) len = std::to_string(len).size() + rest;
    return fmt::format("{} {}={}\n", len, key, value);
  };
  const std::string path = "p\xc3\xa4x/" + std::string(200, 'q') + ".json";
  ASSERT_EQ(record("size", "6"), "9 size=6\n");
  const std::string records =
      record("mtime", "1700000000.123456789") + record("path", path) + record("size", "6");
  const std::string global = record("comment", "global");
  // The header says 0 bytes, the pax record 6 (as for members over 8 GiB): the record wins.
  const std::string body = "{\"a\":1";
  const std::string archive = header("pax_global_header", octal(global.size()), 'g') + padded(global) +
                              header("././@PaxHeader", octal(records.size()), 'x') + padded(records) +
                              header("short.json", octal(0), '0') + padded(body) + kEnd;
  const std::vector<Member> back = read_all(archive);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].name, path);
  EXPECT_EQ(back[0].bytes, body);
}

TEST(Tar, EndsAtTwoZeroBlocksOneZeroBlockOrTheInputsEnd) {
  const std::string one = header("a.txt", octal(1), '0') + padded("a");
  EXPECT_EQ(read_all(one).size(), 1u);                           // no end marker at all
  EXPECT_EQ(read_all(one + std::string(512, '\0')).size(), 1u);  // one zero block
  EXPECT_EQ(read_all(one + kEnd + std::string(8192, '\0'), false).size(),
            1u);  // a record's padding after the end
}

TEST(Tar, DamagedArchivesFailWithTheSourceTheOffsetAndWhat) {
  const std::string good = header("a.jpg", octal(700), '0') + padded(bytes_of(700, 1)) +
                           header("a.cls", octal(1), '0') + padded("3") + kEnd;
  ASSERT_EQ(read_all(good).size(), 2u);
  auto error = [](const std::string& archive, data::TarReaderOptions o = {}) {
    return error_of([&] {
      data::MemorySource source(archive, "shard-000.tar");
      data::TarReader reader(source, o);
      while (reader.next()) reader.read();
    });
  };
  // Cut inside a header, inside the data, inside the padding.
  EXPECT_NE(error(good.substr(0, 300))
                .find("shard-000.tar: not a readable tar archive at byte 300: truncated inside "
                      "a header"),
            std::string::npos)
      << error(good.substr(0, 300));
  EXPECT_NE(error(good.substr(0, 812)).find("at byte 812: truncated"), std::string::npos);
  EXPECT_NE(error(good.substr(0, 1300)).find("truncated"), std::string::npos);
  EXPECT_NE(error(good.substr(0, 1536 + 200)).find("truncated inside a header"), std::string::npos);
  // A flipped byte in a header: the checksum says so.
  std::string flipped = good;
  flipped[1536 + 3] ^= 0x20;
  EXPECT_NE(error(flipped).find("at byte 1536: the header's checksum does not match"), std::string::npos)
      << error(flipped);
  // A size that is not a number, a negative base-256 size.
  EXPECT_NE(error(header("a", "12x4", '0') + kEnd).find("a size that is neither octal nor base-256"),
            std::string::npos);
  std::string negative(12, '\xff');
  EXPECT_NE(error(header("a", negative, '0') + kEnd).find("neither octal nor base-256"), std::string::npos);
  // A zero block followed by more members.
  EXPECT_NE(error(header("a", octal(0), '0') + std::string(512, '\0') + header("b", octal(0), '0') + kEnd)
                .find("a lone zero block inside the archive"),
            std::string::npos);
  // Sparse files, multi-volume archives, a pax header without its member, a broken pax record.
  EXPECT_NE(error(header("s", octal(0), 'S') + kEnd).find("GNU sparse"), std::string::npos);
  EXPECT_NE(error(header("m", octal(0), 'M') + kEnd).find("multi-volume"), std::string::npos);
  const std::string rec = "12 path=abc\n";
  EXPECT_NE(error(header("x", octal(rec.size()), 'x') + padded(rec) + kEnd).find("where the member of a pax"),
            std::string::npos);
  for (const std::string& broken :
       {std::string("99 path=abc\n"), std::string("path=abc\n"), std::string("4 ab\n"),
        std::string("11 path=ab\n?"), std::string("9 =value\n")}) {
    EXPECT_NE(
        error(header("x", octal(broken.size()), 'x') + padded(broken) + header("y", octal(0), '0') + kEnd)
            .find("a pax header with"),
        std::string::npos)
        << broken;
  }
  // A member over the limit is refused before it is read, with the knob to turn.
  data::TarReaderOptions small;
  small.max_member_bytes = 699;
  EXPECT_NE(error(good, small).find("a member of 700 bytes at byte 512, over the limit of 699 bytes"),
            std::string::npos);
  // A size claim far beyond the input: truncated, nothing allocated (the reader only skips).
  std::string huge(12, '\0');
  huge[0] = static_cast<char>(0x80);
  huge[4] = 1;  // 2^56 bytes
  EXPECT_NE(error(header("h", huge, '0')).find("over the limit"), std::string::npos);
  EXPECT_NE(error_of([&] {
              data::MemorySource source(header("h", huge, '0') + kEnd, "h.tar");
              data::TarReader reader(source);
              reader.next();
              reader.next();
            }).find("truncated"),
            std::string::npos);
  // Every error is kind data.
  try {
    data::MemorySource source(flipped, "x");
    data::TarReader reader(source);
    while (reader.next()) {
    }
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kData);
  }
}
