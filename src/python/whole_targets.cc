#include "python/whole_targets.h"

#include <optional>
#include <string_view>
#include <utility>

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

// A new reference from a C API call; a null one raises the pending error.
nb::object Take(PyObject* o) {
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

// The questions PlanWhole asks each tensor, by interned name.
class TensorQuestions {
 public:
  TensorQuestions(nb::tuple plain_types, nb::handle strided, nb::dict dtype_names)
      : plain_types_(plain_types), strided_(strided), dtype_names_(dtype_names) {}

  bool PlainType(nb::handle t) const {
    for (nb::handle type : plain_types_) {
      if (Py_TYPE(t.ptr()) == reinterpret_cast<PyTypeObject*>(type.ptr())) return true;
    }
    return false;
  }
  bool Strided(nb::handle t) const { return Get(t, layout_).ptr() == strided_.ptr(); }
  bool OnCpu(nb::handle t) const { return Get(t, is_cpu_).ptr() == Py_True; }
  bool Contiguous(nb::handle t) const { return Call(t, is_contiguous_).ptr() == Py_True; }
  bool Negated(nb::handle t) const { return Call(t, is_neg_).ptr() == Py_True; }
  bool Conjugated(nb::handle t) const { return Call(t, is_conj_).ptr() == Py_True; }
  nb::object Shape(nb::handle t) const { return Get(t, shape_); }
  void* Data(nb::handle t) const {
    const nb::object p = Call(t, data_ptr_);
    void* data = PyLong_AsVoidPtr(p.ptr());
    if (data == nullptr && PyErr_Occurred()) throw nb::python_error();
    return data;
  }

  // The tensor's dtype as stored, or nullopt for one safetensors cannot hold.
  std::optional<DType> StoredDType(nb::handle t) {
    const nb::object dtype = Get(t, dtype_);
    for (const auto& [seen, stored] : dtypes_) {
      if (seen.ptr() == dtype.ptr()) return stored;
    }
    std::optional<DType> stored;
    PyObject* name = PyDict_GetItemWithError(dtype_names_.ptr(), dtype.ptr());  // borrowed
    if (name == nullptr && PyErr_Occurred()) throw nb::python_error();
    if (name != nullptr && PyUnicode_Check(name)) {
      Result<DType> parsed = ParseDType(PyUnicode_AsUTF8(name));
      if (parsed.ok()) stored = *parsed;
    }
    dtypes_.emplace_back(dtype, stored);
    return stored;
  }

 private:
  static nb::object Get(nb::handle t, const nb::str& name) {
    return Take(PyObject_GetAttr(t.ptr(), name.ptr()));
  }
  static nb::object Call(nb::handle t, const nb::str& name) {
    PyObject* args[] = {t.ptr()};
    return Take(PyObject_VectorcallMethod(name.ptr(), args,
                                          1 | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr));
  }
  static nb::str Interned(const char* name) {
    return nb::steal<nb::str>(PyUnicode_InternFromString(name));
  }

  nb::tuple plain_types_;
  nb::handle strided_;
  nb::dict dtype_names_;
  const nb::str layout_ = Interned("layout"), is_cpu_ = Interned("is_cpu"),
                is_contiguous_ = Interned("is_contiguous"), is_neg_ = Interned("is_neg"),
                is_conj_ = Interned("is_conj"), shape_ = Interned("shape"),
                dtype_ = Interned("dtype"), data_ptr_ = Interned("data_ptr");
  std::vector<std::pair<nb::object, std::optional<DType>>> dtypes_;  // a few entries
};

// `shape` (a torch.Size) as a Shape when it equals `saved`, else nullopt.
std::optional<Shape> SameShape(nb::handle shape, const Shape& saved) {
  if (!PyTuple_Check(shape.ptr()) || PyTuple_GET_SIZE(shape.ptr()) != Py_ssize_t(saved.size())) {
    return std::nullopt;
  }
  for (size_t i = 0; i < saved.size(); ++i) {
    const unsigned long long d = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape.ptr(), i));
    if (d == static_cast<unsigned long long>(-1) && PyErr_Occurred()) throw nb::python_error();
    if (d != saved[i]) return std::nullopt;
  }
  return saved;
}

}  // namespace

nb::tuple PlanWhole(nb::list keys, nb::list tensors, const CheckpointSource& src,
                    nb::tuple plain_types, nb::handle strided, nb::dict dtype_names) {
  if (keys.size() != tensors.size()) {
    throw nb::value_error("plan_whole: keys and tensors differ in length");
  }
  TensorQuestions ask(plain_types, strided, dtype_names);
  TensorFinder saved(src.index);
  WholeTargets whole;
  nb::list taken, rest;
  for (size_t i = 0; i < keys.size(); ++i) {
    const nb::handle key = keys[i], t = tensors[i];
    Py_ssize_t length = 0;
    const char* utf8 = PyUnicode_Check(key.ptr()) ? PyUnicode_AsUTF8AndSize(key.ptr(), &length)
                                                   : nullptr;
    if (utf8 == nullptr) PyErr_Clear();  // not a str (or not encodable): the general path says
    const auto it = utf8 ? saved.Find(std::string_view(utf8, length)) : saved.end();
    const IndexTensor* found = it != saved.end() ? &it->second : nullptr;
    std::optional<Shape> shape;
    // In the order of the Python planner's checks: each only once the
    // ones before have passed (a sparse tensor has no is_contiguous).
    const bool ok = found != nullptr && ask.PlainType(t) && ask.Strided(t) &&
                    ask.StoredDType(t) == found->dtype &&
                    (shape = SameShape(ask.Shape(t), found->shape)) && ask.OnCpu(t) &&
                    ask.Contiguous(t) && !ask.Negated(t) &&
                    !(found->dtype == DType::kC64 && ask.Conjugated(t));  // the one complex dtype
    if (!ok) {
      rest.append(i);
      continue;
    }
    Box box = Box::Whole(*shape);
    whole.targets.push_back({std::string(utf8, length), found->dtype, std::move(*shape),
                             Slice{std::move(box), {}}, ask.Data(t)});
    taken.append(key);
  }
  return nb::make_tuple(std::move(whole), taken, rest);
}

nb::tuple ShapeTuple(const Shape& shape) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(shape.size()));
  if (tuple == nullptr) throw nb::python_error();
  nb::tuple out = nb::steal<nb::tuple>(tuple);
  for (size_t i = 0; i < shape.size(); ++i) {
    PyTuple_SET_ITEM(out.ptr(), i, Take(PyLong_FromUnsignedLongLong(shape[i])).release().ptr());
  }
  return out;
}

nb::list WholeTargetSpecs(const WholeTargets& whole) {
  nb::list out;
  for (const TensorTarget& t : whole.targets) {
    out.append(nb::make_tuple(nb::str(t.key.data(), t.key.size()),
                              nb::str(DTypeName(t.dtype).data(), DTypeName(t.dtype).size()),
                              ShapeTuple(t.shape), ShapeTuple(t.slice.box.offset),
                              ShapeTuple(t.slice.box.size),
                              nb::int_(reinterpret_cast<uintptr_t>(t.data))));
  }
  return out;
}

}  // namespace shardsafe::python
