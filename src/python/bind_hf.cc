// Hugging Face: rename rules in the engine's one dialect, exports (one
// process, or collective: staging, parts, publish) and the expert presets.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "python/bindings.h"
#include "python/status_error.h"
#include "shardsafe/hf.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace shardsafe::python {
namespace {

// (sources, target, dim) of shardsafe.hf.ExpertGroup
using ExpertSpec = std::tuple<std::vector<std::string>, std::string, int>;

// `options` with the export's dtype, rename (RenameRules, a callable or
// None) and expert rules.
ExportHfOptions ExportOptions(ExportHfOptions o, std::optional<std::string> dtype,
                              nb::object rename, const std::vector<ExpertSpec>& experts) {
  if (dtype) o.dtype = Unwrap(ParseDType(*dtype));
  for (const auto& [sources, target, dim] : experts) o.experts.push_back({sources, target, dim});
  if (nb::isinstance<RenameRules>(rename)) {
    o.rename = nb::cast<const RenameRules&>(rename).rules();
  } else if (!rename.is_none()) {
    // Called from ExportHf's planning, on this thread, with the GIL released.
    // Copies of the function (inside the engine, GIL released) copy only the
    // shared_ptr; the last owner is `o`, destroyed with the GIL held.
    auto fn = std::make_shared<nb::object>(rename);
    o.rename_fn = [fn](const std::string& name) -> Result<std::string> {
      nb::gil_scoped_acquire gil;
      try {
        return nb::cast<std::string>((*fn)(name));
      } catch (const std::exception& e) {
        return InvalidArgumentError(std::string("rename raised: ") + e.what());
      }
    };
  }
  return o;
}

// ExportHfStaging for Python: abort() removes the temporary directory now
// (dropping the object does too, later); finish() publishes it.
class ExportStaging {
 public:
  ExportStaging(const std::string& source, const std::string& out, const ExportHfOptions& options,
                std::optional<std::string> dtype, nb::object rename,
                const std::vector<ExpertSpec>& experts) {
    ExportHfOptions o = ExportOptions(options, dtype, rename, experts);
    s_ = Released([&] { return ExportHfStaging::Create(source, out, o); });
  }
  std::string source() const { return Get().source(); }
  std::string dir() const { return Get().dir(); }
  ExportHfStats Finish() { return Released([&] { return Get().Finish(); }); }
  void Abort() {
    nb::gil_scoped_release release;
    s_.reset();
  }

 private:
  ExportHfStaging& Get() const {
    if (!s_) Check(FailedPreconditionError("the export was aborted"));
    return *s_;
  }
  std::unique_ptr<ExportHfStaging> s_;
};

RenameRules MakeRenameRules(const std::vector<std::pair<std::string, std::string>>& rules) {
  std::vector<RenameRule> r;
  for (const auto& [pattern, replacement] : rules) r.push_back({pattern, replacement});
  return Unwrap(RenameRules::Create(r));
}

std::vector<std::pair<std::string, std::string>> RulesOf(const RenameRules& r) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const RenameRule& rule : r.rules()) out.emplace_back(rule.pattern, rule.replacement);
  return out;
}

ExportHfStats Export(const std::string& source, const std::string& out,
                     const ExportHfOptions& options, std::optional<std::string> dtype,
                     nb::object rename, const std::vector<ExpertSpec>& experts) {
  ExportHfOptions o = ExportOptions(options, dtype, rename, experts);
  return Released([&] { return ExportHf(source, out, o); });
}

ExportHfStats ExportPart(const std::string& source, const std::string& dir,
                         const ExportHfOptions& options, std::optional<std::string> dtype,
                         nb::object rename, const std::vector<ExpertSpec>& experts, int index,
                         int count) {
  ExportHfOptions o = ExportOptions(options, dtype, rename, experts);
  return Released([&] { return ExportHfPart(source, dir, o, index, count); });
}

// transformers' expert layouts (shardsafe/hf.h), kept once in the engine.
std::pair<std::vector<ExpertSpec>, std::vector<ExpertSpec>> ExpertPresets() {
  auto specs = [](const std::vector<ExpertRule>& rules) {
    std::vector<ExpertSpec> out;
    for (const ExpertRule& r : rules) out.emplace_back(r.sources, r.target, r.dim);
    return out;
  };
  return {specs(Qwen2MoeExperts()), specs(MixtralExperts())};
}

}  // namespace

void BindHf(nb::module_& m) {
  // Rename rules in the engine's one dialect (shardsafe/hf.h RenameRule),
  // for loads as for exports.
  nb::class_<RenameRules>(m, "RenameRules")
      .def(nb::new_(&MakeRenameRules), "rules"_a)
      .def("__call__", &RenameRules::Apply, "name"_a)
      .def_prop_ro("rules", &RulesOf);
  m.def("export_hf", &Export, "source"_a, "out"_a, "options"_a, "dtype"_a.none(),
        "rename"_a.none(), "experts"_a);
  // A collective export (shardsafe.hf.export with a process group): the
  // publishing rank holds the staging; every rank writes its part.
  nb::class_<ExportStaging>(m, "ExportHfStaging")
      .def(nb::init<const std::string&, const std::string&, const ExportHfOptions&,
                    std::optional<std::string>, nb::object, const std::vector<ExpertSpec>&>(),
           "source"_a, "out"_a, "options"_a, "dtype"_a.none(), "rename"_a.none(), "experts"_a)
      .def_prop_ro("source", &ExportStaging::source)
      .def_prop_ro("dir", &ExportStaging::dir)
      .def("finish", &ExportStaging::Finish)
      .def("abort", &ExportStaging::Abort);
  m.def("export_hf_part", &ExportPart, "source"_a, "dir"_a, "options"_a, "dtype"_a.none(),
        "rename"_a.none(), "experts"_a, "index"_a, "count"_a);
  m.def("expert_presets", &ExpertPresets);
}

}  // namespace shardsafe::python
