#pragma once
// Config: typed key/value configuration with a declared schema.
//
// Every key is declared once in code (name, type, default, one-line doc);
// values then come, in increasing precedence, from the declared defaults, a
// TOML file (a recipe's default config, or --config FILE), and key=value
// overrides. Unknown keys and values of the wrong type are errors that name
// the key and suggest the nearest declared one. Keys are dotted paths
// ("trainer.epochs"), which map to TOML tables ([trainer] epochs = 3).

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ember/core/error.h"

namespace ember::core {

using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

/// The allowed values of a numeric key (of each element, for a list). A value
/// outside, NaN or an infinity, is refused where it is set (a file or the command line),
/// before any work, with the key, the value and the range in the message.
struct Bounds {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_open = false;  ///< min itself is excluded (a rate: > 0)
  bool max_open = false;  ///< max itself is excluded (a probability: < 1)

  /// >= m.
  static Bounds at_least(double m) { return {m}; }
  /// > 0.
  static Bounds positive() { return {0.0, std::numeric_limits<double>::infinity(), true}; }
  /// [lo, hi].
  static Bounds between(double lo, double hi) { return {lo, hi}; }
  /// [lo, hi).
  static Bounds from_below(double lo, double hi) { return {lo, hi, false, true}; }

  bool contains(double v) const;
  /// ">= 1", "> 0", "in [0, 1)", "" when unbounded.
  std::string describe() const;
};

/// Whether a run that continues another (a resume) may give a key another
/// value than the run it continues had. recipe::claim_run_folder refuses a
/// resume that changes a kMustMatch key (unless run.allow_changes=true) and
/// lists the kMayChange ones it changes.
enum class OnResume {
  kMustMatch,  ///< the key changes what is trained or in what order (the default)
  kMayChange,  ///< it does not: output, monitoring, devices and threads, where the data is
               ///< read from, when to stop
};

/// One declared key.
struct ConfigEntry {
  ConfigValue value;  ///< current value (starts as the default)
  ConfigValue default_value;
  std::string doc;     ///< one line for --help
  std::string source;  ///< where the current value came from ("default", a file, "command line")
  Bounds bounds;       ///< numeric keys: the allowed values
  OnResume on_resume = OnResume::kMustMatch;
};

class Config {
 public:
  /// Declares a key. Declaring the same key twice is an error. The last
  /// argument says whether a resumed run may change it.
  Config& declare(const std::string& key, bool default_value, std::string doc,
                  OnResume on_resume = OnResume::kMustMatch);
  /// Numeric keys take optional Bounds (the default must lie inside).
  Config& declare(const std::string& key, int64_t default_value, std::string doc, Bounds bounds = {},
                  OnResume on_resume = OnResume::kMustMatch);
  Config& declare(const std::string& key, int default_value, std::string doc, Bounds bounds = {},
                  OnResume on_resume = OnResume::kMustMatch) {
    return declare(key, static_cast<int64_t>(default_value), std::move(doc), bounds, on_resume);
  }
  Config& declare(const std::string& key, double default_value, std::string doc, Bounds bounds = {},
                  OnResume on_resume = OnResume::kMustMatch);
  /// Unbounded numeric keys with an OnResume (without these, a number would
  /// convert to the bool overload's default).
  Config& declare(const std::string& key, int64_t default_value, std::string doc, OnResume on_resume) {
    return declare(key, default_value, std::move(doc), Bounds(), on_resume);
  }
  Config& declare(const std::string& key, int default_value, std::string doc, OnResume on_resume) {
    return declare(key, static_cast<int64_t>(default_value), std::move(doc), Bounds(), on_resume);
  }
  Config& declare(const std::string& key, double default_value, std::string doc, OnResume on_resume) {
    return declare(key, default_value, std::move(doc), Bounds(), on_resume);
  }
  Config& declare(const std::string& key, const char* default_value, std::string doc,
                  OnResume on_resume = OnResume::kMustMatch);
  Config& declare(const std::string& key, std::string default_value, std::string doc,
                  OnResume on_resume = OnResume::kMustMatch);
  Config& declare(const std::string& key, std::vector<double> default_value, std::string doc,
                  Bounds bounds = {}, OnResume on_resume = OnResume::kMustMatch);

  /// Merges a TOML document; `source` names it in error messages.
  void merge_toml(std::string_view text, const std::string& source);
  /// Reads and merges a TOML file.
  void merge_toml_file(const std::string& path);
  /// Applies one "key=value" override; the value is parsed as the key's type.
  void set_override(const std::string& assignment);

  /// Registers a check over the resolved values: a rule across keys, or the
  /// parse of a name (an area's <area>_options_from_config, registered by its
  /// declare_<area>_keys). It throws ember::Error naming the key.
  Config& add_check(std::function<void(const Config&)> check);
  /// Runs every registered check. A program calls it once its file and
  /// overrides are in, before any work (the recipe runner does: no run
  /// folder, data or process exists yet when a bad value is reported).
  void validate() const;

  bool has(const std::string& key) const { return entries_.count(key) != 0; }
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key) const;
  /// The value as it would be written on the command line (any type).
  std::string get_text(const std::string& key) const;
  /// Whether a resumed run may change the key (as declared).
  OnResume on_resume(const std::string& key) const;
  /// parse(get_string(key)) for a name (an enum's): an error it throws is
  /// rethrown as a config error that starts with the key and the value.
  template <typename Parse>
  auto get_parsed(const std::string& key, Parse&& parse) const -> decltype(parse(std::string())) {
    const std::string value = get_string(key);
    try {
      return parse(value);
    } catch (const Error& e) {
      throw Error(ErrorKind::kConfig, "[config] " + key + "=\"" + value + "\": " + e.what());
    }
  }

  /// The resolved configuration as a TOML document (what a run saves).
  std::string to_toml() const;
  /// Every key with its type, default and doc, grouped by table.
  std::string help() const;
  /// A stable 64-bit hash of the resolved values (for comparing runs/ranks).
  uint64_t hash() const;
  /// The declared keys, sorted.
  std::vector<std::string> keys() const;

 private:
  Config& declare_value(const std::string& key, ConfigValue value, std::string doc, Bounds bounds,
                        OnResume on_resume);
  const ConfigEntry& entry(const std::string& key) const;
  ConfigEntry& entry_for_update(const std::string& key, const std::string& source);
  std::map<std::string, ConfigEntry> entries_;
  std::vector<std::function<void(const Config&)>> checks_;
};

/// The declared key closest to `key` by edit distance ("" if none is close).
std::string nearest_key(const Config& config, const std::string& key);

}  // namespace ember::core
