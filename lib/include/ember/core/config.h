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
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace ember::core {

using ConfigValue = std::variant<bool, int64_t, double, std::string, std::vector<double>>;

/// One declared key.
struct ConfigEntry {
  ConfigValue value;  ///< current value (starts as the default)
  ConfigValue default_value;
  std::string doc;     ///< one line for --help
  std::string source;  ///< where the current value came from ("default", a file, "command line")
};

class Config {
 public:
  /// Declares a key. Declaring the same key twice is an error.
  Config& declare(const std::string& key, bool default_value, std::string doc);
  Config& declare(const std::string& key, int64_t default_value, std::string doc);
  Config& declare(const std::string& key, int default_value, std::string doc) {
    return declare(key, static_cast<int64_t>(default_value), std::move(doc));
  }
  Config& declare(const std::string& key, double default_value, std::string doc);
  Config& declare(const std::string& key, const char* default_value, std::string doc);
  Config& declare(const std::string& key, std::string default_value, std::string doc);
  Config& declare(const std::string& key, std::vector<double> default_value, std::string doc);

  /// Merges a TOML document; `source` names it in error messages.
  void merge_toml(std::string_view text, const std::string& source);
  /// Reads and merges a TOML file.
  void merge_toml_file(const std::string& path);
  /// Applies one "key=value" override; the value is parsed as the key's type.
  void set_override(const std::string& assignment);

  bool has(const std::string& key) const { return entries_.count(key) != 0; }
  bool get_bool(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  std::vector<double> get_float_list(const std::string& key) const;

  /// The resolved configuration as a TOML document (what a run saves).
  std::string to_toml() const;
  /// Every key with its type, default and doc, grouped by table.
  std::string help() const;
  /// A stable 64-bit hash of the resolved values (for comparing runs/ranks).
  uint64_t hash() const;
  /// The declared keys, sorted.
  std::vector<std::string> keys() const;

 private:
  Config& declare_value(const std::string& key, ConfigValue value, std::string doc);
  const ConfigEntry& entry(const std::string& key) const;
  ConfigEntry& entry_for_update(const std::string& key, const std::string& source);
  std::map<std::string, ConfigEntry> entries_;
};

/// The declared key closest to `key` by edit distance ("" if none is close).
std::string nearest_key(const Config& config, const std::string& key);

}  // namespace ember::core
