// data::HttpSource: a shard over HTTP(S) through libcurl, loaded when first
// used (dlopen), so that libember needs no libcurl to load: a machine without
// it can still read local and pipe: shards, and gets a clear error for URLs.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "ember/data/byte_source.h"

#if __has_include(<curl/curl.h>)
#include <curl/curl.h>
#define EMBER_HAVE_CURL_HEADERS 1
#else
#define EMBER_HAVE_CURL_HEADERS 0
#endif

namespace ember::data {

#if EMBER_HAVE_CURL_HEADERS
// Named, not anonymous: HttpSource::Transfer (a class of the public header)
// holds a Curl, which GCC would warn about from an anonymous namespace when
// this file is compiled in a unity batch (-Wsubobject-linkage).
namespace curl_api {

/// libcurl's functions, resolved once from libcurl.so.4 (its ABI since 2006).
struct Curl {
  CURLcode (*global_init)(long);
  CURL* (*easy_init)();
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  CURLcode (*easy_pause)(CURL*, int);
  void (*easy_cleanup)(CURL*);
  const char* (*easy_strerror)(CURLcode);
  CURLM* (*multi_init)();
  CURLMcode (*multi_add_handle)(CURLM*, CURL*);
  CURLMcode (*multi_remove_handle)(CURLM*, CURL*);
  CURLMcode (*multi_perform)(CURLM*, int*);
  CURLMcode (*multi_poll)(CURLM*, struct curl_waitfd*, unsigned int, int, int*);
  CURLMsg* (*multi_info_read)(CURLM*, int*);
  CURLMcode (*multi_cleanup)(CURLM*);
  std::string missing;  // why it could not be loaded; empty when loaded
};

const Curl& curl() {
  static Curl c;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = ::dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      c.missing = ::dlerror();
      return;
    }
    bool ok = true;
    auto get = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(::dlsym(lib, name));
      if (fn == nullptr) {
        ok = false;
        c.missing = std::string("libcurl.so.4 has no ") + name + " (libcurl 7.66 or later is needed)";
      }
    };
    get(c.global_init, "curl_global_init");
    get(c.easy_init, "curl_easy_init");
    get(c.easy_setopt, "curl_easy_setopt");
    get(c.easy_getinfo, "curl_easy_getinfo");
    get(c.easy_pause, "curl_easy_pause");
    get(c.easy_cleanup, "curl_easy_cleanup");
    get(c.easy_strerror, "curl_easy_strerror");
    get(c.multi_init, "curl_multi_init");
    get(c.multi_add_handle, "curl_multi_add_handle");
    get(c.multi_remove_handle, "curl_multi_remove_handle");
    get(c.multi_perform, "curl_multi_perform");
    get(c.multi_poll, "curl_multi_poll");
    get(c.multi_info_read, "curl_multi_info_read");
    get(c.multi_cleanup, "curl_multi_cleanup");
    if (ok && c.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) c.missing = "curl_global_init failed";
  });
  return c;
}

}  // namespace curl_api

using curl_api::Curl;
using curl_api::curl;

namespace {

constexpr size_t kPauseAbove = size_t{8} << 20;  // received bytes held before the transfer pauses

bool retryable_status(long status) {
  return status == 408 || status == 429 || (status >= 500 && status <= 599);
}

}  // namespace

struct HttpSource::Transfer {
  const Curl& c = curl();
  CURLM* multi = nullptr;
  CURL* easy = nullptr;
  std::string buffer;    // received, not yet read
  size_t at = 0;         // read up to here in `buffer`
  int64_t received = 0;  // body bytes taken into `buffer`, over every attempt
  int64_t offset = 0;    // where this attempt's body starts (its Range)
  int64_t skip = 0;      // body bytes of this attempt to drop (a server that ignored Range)
  long status = 0;
  bool bad_status = false;
  bool paused = false;
  bool done = false;
  char error[CURL_ERROR_SIZE] = {0};

  ~Transfer() { close(); }
  void close() {
    if (easy != nullptr) {
      c.multi_remove_handle(multi, easy);
      c.easy_cleanup(easy);
      easy = nullptr;
    }
    if (multi != nullptr) {
      c.multi_cleanup(multi);
      multi = nullptr;
    }
  }

  static size_t on_body(char* data, size_t size, size_t n, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const size_t bytes = size * n;
    if (t->status == 0) {
      t->c.easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->status);
      if (t->status == 200 && t->offset > 0) t->skip = t->offset;  // Range ignored: the whole body again
    }
    if (t->status != 200 && t->status != 206) {
      t->bad_status = true;
      return 0;  // aborts the attempt (CURLE_WRITE_ERROR); the status says why
    }
    if (t->buffer.size() - t->at > kPauseAbove) {
      t->paused = true;
      return CURL_WRITEFUNC_PAUSE;  // redelivered after easy_pause(CONT)
    }
    size_t from = 0;
    if (t->skip > 0) {
      from = static_cast<size_t>(std::min<int64_t>(t->skip, static_cast<int64_t>(bytes)));
      t->skip -= static_cast<int64_t>(from);
    }
    t->buffer.append(data + from, bytes - from);
    t->received += static_cast<int64_t>(bytes - from);
    return bytes;
  }
};

HttpSource::HttpSource(std::string url, HttpOptions options) : url_(std::move(url)), options_(options) {
  EMBER_CHECK_KIND(
      kConfig, options_.retries >= 0 && options_.stall_seconds >= 1 && options_.connect_timeout_seconds >= 1,
      "[data] {}: retries >= 0, stall_seconds >= 1 and connect_timeout_seconds >= 1, got {}, {}, {}", url_,
      options_.retries, options_.stall_seconds, options_.connect_timeout_seconds);
  if (!curl().missing.empty())
    ember::detail::fail(
        ErrorKind::kData,
        "[data] {}: HTTP shards need libcurl (libcurl.so.4), which cannot be loaded here ({}); install "
        "it (Debian: libcurl4), or read the shard through a command: pipe:curl -fsS {}",
        url_, curl().missing, url_);
  start(0);
}

HttpSource::~HttpSource() = default;

void HttpSource::start(int64_t offset) {
  const Curl& c = curl();
  transfer_ = std::make_unique<Transfer>();
  Transfer& t = *transfer_;
  t.received = offset;
  t.offset = offset;
  t.multi = c.multi_init();
  t.easy = c.easy_init();
  EMBER_CHECK_KIND(kData, t.multi != nullptr && t.easy != nullptr,
                   "[data] {}: libcurl could not start a transfer", url_);
  c.easy_setopt(t.easy, CURLOPT_URL, url_.c_str());
  c.easy_setopt(t.easy, CURLOPT_FOLLOWLOCATION, 1L);
  c.easy_setopt(t.easy, CURLOPT_NOSIGNAL, 1L);
  c.easy_setopt(t.easy, CURLOPT_CONNECTTIMEOUT, static_cast<long>(options_.connect_timeout_seconds));
  // A stall: under 1 byte/s for stall_seconds (a paused transfer does not count).
  c.easy_setopt(t.easy, CURLOPT_LOW_SPEED_LIMIT, 1L);
  c.easy_setopt(t.easy, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.stall_seconds));
  c.easy_setopt(t.easy, CURLOPT_ERRORBUFFER, t.error);
  c.easy_setopt(t.easy, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  c.easy_setopt(t.easy, CURLOPT_WRITEDATA, &t);
  c.easy_setopt(t.easy, CURLOPT_USERAGENT, "ember-shards");
  if (offset > 0) {
    range_ = std::to_string(offset) + "-";
    c.easy_setopt(t.easy, CURLOPT_RANGE, range_.c_str());
  }
  c.multi_add_handle(t.multi, t.easy);
}

/// Runs the transfer until it has bytes for read() or has ended; an ended
/// attempt that failed is retried from where it stopped, or reported.
void HttpSource::pump() {
  const Curl& c = curl();
  Transfer& t = *transfer_;
  int running = 0;
  c.multi_perform(t.multi, &running);
  int left = 0;
  while (CURLMsg* msg = c.multi_info_read(t.multi, &left)) {
    if (msg->msg != CURLMSG_DONE) continue;
    const CURLcode result = msg->data.result;
    long status = t.status;
    c.easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &status);
    if (result == CURLE_OK && (status == 200 || status == 206)) {
      t.done = true;
      return;
    }
    const bool http_error = t.bad_status || (result == CURLE_OK && status >= 300);
    const std::string what = http_error ? fmt::format("HTTP status {}", status)
                                        : fmt::format("{} ({})", c.easy_strerror(result),
                                                      t.error[0] != '\0' ? t.error : "no details");
    const bool retry = http_error ? retryable_status(status) : true;
    ++attempts_;
    if (!retry || attempts_ > options_.retries) {
      ember::detail::fail(
          ErrorKind::kData, "[data] {}: {} after {} attempt(s){} at byte {}; {}", url_, what, attempts_,
          retry ? fmt::format(" (retried {} times, backing off from {} s)", options_.retries,
                              options_.backoff_seconds)
                : " (not retried: the server's answer will not change)",
          t.received,
          http_error && status == 404 ? "check the URL and the shard list"
                                      : "check the server, the network, or raise data.http_retries");
    }
    const double wait =
        std::min(30.0, options_.backoff_seconds * static_cast<double>(1 << std::min(attempts_ - 1, 10)));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    // Resume where the body stopped (a Range request); keep what is buffered.
    std::string buffered = t.buffer.substr(t.at);
    const int64_t received = t.received;
    start(received);
    transfer_->buffer = std::move(buffered);
    return;
  }
  if (t.paused && t.buffer.size() - t.at <= kPauseAbove / 2) {
    t.paused = false;
    c.easy_pause(t.easy, CURLPAUSE_CONT);
  }
  if (running > 0 && t.buffer.size() == t.at) c.multi_poll(t.multi, nullptr, 0, 200, nullptr);
}

size_t HttpSource::read(char* out, size_t n) {
  for (;;) {
    Transfer& t = *transfer_;
    if (t.at < t.buffer.size()) {
      const size_t got = std::min(n, t.buffer.size() - t.at);
      std::memcpy(out, t.buffer.data() + t.at, got);
      t.at += got;
      if (t.at == t.buffer.size()) {
        t.buffer.clear();
        t.at = 0;
      } else if (t.at > (size_t{4} << 20)) {
        t.buffer.erase(0, t.at);
        t.at = 0;
      }
      return got;
    }
    if (t.done) return 0;
    pump();
  }
}

#else  // no <curl/curl.h> at build time

struct HttpSource::Transfer {};
HttpSource::HttpSource(std::string url, HttpOptions options) : url_(std::move(url)), options_(options) {
  ember::detail::fail(
      ErrorKind::kData,
      "[data] {}: this Ember was built without libcurl's headers (Debian: libcurl4-openssl-dev), so it "
      "cannot read HTTP shards; read it through a command: pipe:curl -fsS {}",
      url_, url_);
}
HttpSource::~HttpSource() = default;
void HttpSource::start(int64_t) {}
void HttpSource::pump() {}
size_t HttpSource::read(char*, size_t) {
  return 0;
}

#endif

}  // namespace ember::data
