// Names on the way out of a checkpoint: which keys an export takes, how
// grouped expert tensors split into per-expert ones, and the rename rules.
//
// Patterns are RE2 (shardsafe/hf.h RenameRule); they are compiled once and
// reported with the offending pattern when bad.
// Expert patterns are not regexes: literal dot-separated parts, one of
// which in each source is `*` (an expert number), matched as whole parts
// anywhere in a key.
// Thread-compatible: const methods may be called concurrently.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardsafe/hf.h"

namespace shardsafe {

// The prefix / include / exclude selection of ExportHfOptions.
class KeyFilter {
 public:
  static Result<KeyFilter> Create(const ExportHfOptions& options);
  KeyFilter(KeyFilter&&) noexcept;
  ~KeyFilter();
  // The key without the prefix if it is selected, else nullopt.
  std::optional<std::string> Select(const std::string& key) const;

 private:
  KeyFilter() = default;
  std::string prefix_;
  std::vector<std::unique_ptr<re2::RE2>> include_, exclude_;
};

// Ordered rename rules (re.sub semantics, each rule applied to the previous
// one's result), or the caller's function.
class Renamer {
 public:
  static Result<Renamer> Create(const ExportHfOptions& options);
  Renamer(Renamer&&) noexcept;
  ~Renamer();
  Result<std::string> Apply(const std::string& name) const;

 private:
  Renamer() = default;
  std::optional<RenameRules> rules_;
  std::function<Result<std::string>(const std::string&)> fn_;
};

// One per-expert tensor cut out of a grouped one.
struct ExpertPart {
  std::string name;  // per-expert name (before renaming)
  Box box;           // in the grouped tensor: [e], and part j of `dim`
  Shape shape;       // box.size without the leading 1
};

// Where `name` (of a tensor of `shape`) matches a rule's target, the
// per-expert tensors it splits into (expert-major, sources in rule order);
// an empty list when no rule matches. InvalidArgument when a rule matches
// but does not fit the shape (a 0-d tensor, a dim out of range, a dim not
// divisible into the parts), naming the tensor and the rule.
Result<std::vector<ExpertPart>> SplitExperts(const std::string& name, const Shape& shape,
                                             const std::vector<ExpertRule>& rules);

// Checks the rules themselves: each source holds exactly one `*` part, the
// target none and is non-empty. InvalidArgument naming the rule.
Status ValidateExpertRules(const std::vector<ExpertRule>& rules);

}  // namespace shardsafe
