// Config files and command-line overrides (core::Config::merge_toml,
// set_override, validate) with every key a classification recipe declares.
// The input is a TOML file, optionally followed by "\n---\n" and one
// key=value override per line. Accepted configs must survive to_toml: the
// written file, read into a fresh config, writes back the same text.
#include "ember/core/config.h"
#include "ember/data/image_folder.h"
#include "ember/recipe/classification.h"
#include "ember/recipe/recipe.h"
#include "fuzz/fuzz_common.h"

namespace {
ember::core::Config declared() {
  ember::core::Config c;
  ember::recipe::declare_recipe_keys(c);
  ember::recipe::declare_classification_keys(c, ember::recipe::ClassificationOptions());
  ember::data::declare_image_folder_keys(c, ember::data::ImageFolderOptions({32, 32}));
  return c;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input = ember::fuzz::bytes_of(data, size);
  return ember::fuzz::run([&] {
    const size_t split = input.find("\n---\n");
    ember::core::Config c = declared();
    c.merge_toml(input.substr(0, split), "fuzz.toml");
    if (split != std::string_view::npos) {
      std::string_view rest = input.substr(split + 5);
      while (!rest.empty()) {
        const size_t eol = rest.find('\n');
        const std::string line(rest.substr(0, eol));
        if (!line.empty()) c.set_override(line);
        rest = eol == std::string_view::npos ? std::string_view() : rest.substr(eol + 1);
      }
    }
    c.validate();
    const std::string text = c.to_toml();
    ember::core::Config again = declared();
    again.merge_toml(text, "fuzz-roundtrip.toml");
    EMBER_FUZZ_ASSERT(again.to_toml() == text);
  });
}
