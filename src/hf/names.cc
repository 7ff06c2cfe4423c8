#include "hf/names.h"

#include <re2/re2.h>

namespace shardsafe {
namespace {

Result<std::unique_ptr<re2::RE2>> Compile(const std::string& pattern, std::string_view what) {
  RE2::Options opts;
  opts.set_log_errors(false);
  auto re = std::make_unique<re2::RE2>(pattern, opts);
  if (!re->ok()) {
    return InvalidArgumentError(std::string(what) + " pattern \"" + pattern +
                                "\": " + re->error());
  }
  return re;
}

std::string_view StripDots(std::string_view s) {
  while (!s.empty() && s.front() == '.') s.remove_prefix(1);
  while (!s.empty() && s.back() == '.') s.remove_suffix(1);
  return s;
}

// Position of `part` in `key` as whole dot-separated parts, or npos.
size_t FindParts(std::string_view key, std::string_view part) {
  for (size_t p = key.find(part); p != std::string_view::npos; p = key.find(part, p + 1)) {
    const bool starts = p == 0 || key[p - 1] == '.';
    const size_t end = p + part.size();
    if (starts && (end == key.size() || key[end] == '.')) return p;
  }
  return std::string_view::npos;
}

std::string RuleName(const ExpertRule& rule) {
  std::string s;
  for (const std::string& src : rule.sources) s += (s.empty() ? "" : " + ") + src;
  return s + " -> " + rule.target;
}

}  // namespace

KeyFilter::KeyFilter(KeyFilter&&) noexcept = default;
KeyFilter::~KeyFilter() = default;

Result<KeyFilter> KeyFilter::Create(const ExportHfOptions& options) {
  KeyFilter f;
  f.prefix_ = options.prefix;
  for (const std::string& p : options.include) {
    SS_ASSIGN_OR_RETURN(auto re, Compile(p, "include"));
    f.include_.push_back(std::move(re));
  }
  for (const std::string& p : options.exclude) {
    SS_ASSIGN_OR_RETURN(auto re, Compile(p, "exclude"));
    f.exclude_.push_back(std::move(re));
  }
  return f;
}

std::optional<std::string> KeyFilter::Select(const std::string& key) const {
  if (!key.starts_with(prefix_)) return std::nullopt;
  std::string rest = key.substr(prefix_.size());
  auto matches = [&](const auto& re) { return RE2::PartialMatch(rest, *re); };
  if (!include_.empty() && std::none_of(include_.begin(), include_.end(), matches)) {
    return std::nullopt;
  }
  if (std::any_of(exclude_.begin(), exclude_.end(), matches)) return std::nullopt;
  return rest;
}

RenameRules::RenameRules(RenameRules&&) noexcept = default;
RenameRules& RenameRules::operator=(RenameRules&&) noexcept = default;
RenameRules::~RenameRules() = default;

Result<RenameRules> RenameRules::Create(const std::vector<RenameRule>& rules) {
  RenameRules r;
  for (const RenameRule& rule : rules) {
    SS_ASSIGN_OR_RETURN(auto re, Compile(rule.pattern, "rename"));
    std::string error;
    if (!re->CheckRewriteString(rule.replacement, &error)) {
      return InvalidArgumentError("rename rule \"" + rule.pattern + "\" -> \"" +
                                  rule.replacement + "\": " + error);
    }
    r.compiled_.push_back(std::move(re));
  }
  r.rules_ = rules;
  return r;
}

std::string RenameRules::Apply(const std::string& name) const {
  std::string out = name;
  for (size_t i = 0; i < compiled_.size(); ++i) {
    RE2::GlobalReplace(&out, *compiled_[i], rules_[i].replacement);
  }
  return out;
}

Renamer::Renamer(Renamer&&) noexcept = default;
Renamer::~Renamer() = default;

Result<Renamer> Renamer::Create(const ExportHfOptions& options) {
  Renamer r;
  r.fn_ = options.rename_fn;
  SS_ASSIGN_OR_RETURN(r.rules_, RenameRules::Create(options.rename));
  return r;
}

Result<std::string> Renamer::Apply(const std::string& name) const {
  if (fn_) return fn_(name);
  return rules_->Apply(name);
}

Status ValidateExpertRules(const std::vector<ExpertRule>& rules) {
  for (const ExpertRule& rule : rules) {
    const std::string who = "expert rule " + RuleName(rule);
    if (rule.sources.empty()) return InvalidArgumentError(who + ": no source pattern");
    for (const std::string& s : rule.sources) {
      if (std::count(s.begin(), s.end(), '*') != 1) {
        return InvalidArgumentError(who + ": source \"" + s +
                                    "\" must hold exactly one '*' (the expert number)");
      }
    }
    if (StripDots(rule.target).empty() || rule.target.find('*') != std::string::npos) {
      return InvalidArgumentError(who + ": the target must be a name without '*'");
    }
  }
  return Status();
}

Result<std::vector<ExpertPart>> SplitExperts(const std::string& name, const Shape& shape,
                                             const std::vector<ExpertRule>& rules) {
  for (const ExpertRule& rule : rules) {
    const std::string_view target = StripDots(rule.target);
    const size_t at = FindParts(name, target);
    if (at == std::string::npos) continue;
    const std::string who = "tensor \"" + name + "\" " + ShapeToString(shape) +
                            " (expert rule " + RuleName(rule) + ")";
    const size_t parts = rule.sources.size();
    const int rank = static_cast<int>(shape.size());
    const int dim = rule.dim < 0 ? rank + rule.dim : rule.dim;
    if (rank < 1) return InvalidArgumentError(who + ": a grouped tensor needs an expert dim");
    if (parts > 1 && (dim < 1 || dim >= rank || shape[dim] % parts != 0)) {
      return InvalidArgumentError(who + ": cannot cut dim " + std::to_string(rule.dim) +
                                  " into " + std::to_string(parts) + " equal parts");
    }
    const std::string head = name.substr(0, at), tail = name.substr(at + target.size());
    std::vector<ExpertPart> out;
    for (uint64_t e = 0; e < shape[0]; ++e) {
      for (size_t j = 0; j < parts; ++j) {
        std::string src(StripDots(rule.sources[j]));
        src.replace(src.find('*'), 1, std::to_string(e));
        Box box = Box::Whole(shape);
        box.offset[0] = e;
        box.size[0] = 1;
        if (parts > 1) {
          box.size[dim] = shape[dim] / parts;
          box.offset[dim] = j * box.size[dim];
        }
        Shape per(box.size.begin() + 1, box.size.end());
        out.push_back({head + src + tail, std::move(box), std::move(per)});
      }
    }
    return out;
  }
  return std::vector<ExpertPart>{};
}

std::vector<ExpertRule> Qwen2MoeExperts() {
  return {{{"mlp.experts.*.gate_proj.weight", "mlp.experts.*.up_proj.weight"},
           "mlp.experts.gate_up_proj", 1},
          {{"mlp.experts.*.down_proj.weight"}, "mlp.experts.down_proj", 1}};
}

std::vector<ExpertRule> MixtralExperts() {
  return {{{"experts.*.w1.weight", "experts.*.w3.weight"}, "experts.gate_up_proj", 1},
          {{"experts.*.w2.weight"}, "experts.down_proj", 1}};
}

}  // namespace shardsafe
