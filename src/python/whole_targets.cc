#include "python/whole_targets.h"

#include <algorithm>
#include <optional>
#include <string_view>
#include <utility>

#include "format/index_packed.h"

namespace nb = nanobind;

namespace shardsafe::python {
namespace {

// A new reference from a C API call; a null one raises the pending error.
nb::object Take(PyObject* o) {
  if (o == nullptr) throw nb::python_error();
  return nb::steal(o);
}

// The questions the fast paths ask each tensor, by interned name.
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
    return nb::borrow<nb::str>(Take(PyUnicode_InternFromString(name)));
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

// A torch.Size as a Shape.
Shape ShapeOf(nb::handle size) {
  if (!PyTuple_Check(size.ptr())) throw nb::type_error("tensor.shape is not a tuple");
  Shape shape(static_cast<size_t>(PyTuple_GET_SIZE(size.ptr())));
  for (size_t i = 0; i < shape.size(); ++i) {
    shape[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(size.ptr(), i));
    if (shape[i] == static_cast<uint64_t>(-1) && PyErr_Occurred()) throw nb::python_error();
  }
  return shape;
}

// `t` as both fast paths take it: a plain type, strided, of a dtype
// safetensors stores, on the CPU, contiguous, with neither the negative nor
// (the one complex dtype, C64) the conjugate bit. Each question only once
// the ones before have passed, as the Python planners ask them (a sparse
// tensor has no is_contiguous). Its shape goes to `dims`.
AskedTensor AskPlain(TensorQuestions& ask, std::string_view key, nb::handle t,
                     std::vector<uint64_t>* dims) {
  AskedTensor asked{key};
  if (!ask.PlainType(t) || !ask.Strided(t)) return asked;
  const std::optional<DType> dtype = ask.StoredDType(t);
  if (!dtype) return asked;
  const Shape shape = ShapeOf(ask.Shape(t));
  if (!ask.OnCpu(t) || !ask.Contiguous(t) || ask.Negated(t) ||
      (*dtype == DType::kC64 && ask.Conjugated(t))) {
    return asked;
  }
  asked.data = ask.Data(t);
  asked.dims_at = static_cast<uint32_t>(dims->size());
  asked.ndim = static_cast<uint8_t>(shape.size());
  asked.dtype = *dtype;
  asked.plain = true;
  dims->insert(dims->end(), shape.begin(), shape.end());
  return asked;
}

// The fast paths' loop over the tensors asked: `take(i, t)` takes the
// tensor asked plain (whole, under its key) or leaves it, whose index
// then goes to `rest`. Frees what was asked.
template <typename Take>
void PlanEach(AskedTensors& asked, Take take, nb::list* rest) {
  if (asked.planned) throw nb::value_error("these tensors were planned already");
  asked.planned = true;
  for (size_t i = 0; i < asked.asked.size(); ++i) {
    const AskedTensor& t = asked.asked[i];
    if (!t.plain || !take(i, t)) rest->append(i);
  }
  std::vector<AskedTensor>().swap(asked.asked);
  std::vector<uint64_t>().swap(asked.dims);
}

nb::str Str(std::string_view s) { return nb::str(s.data(), s.size()); }

// (key, dtype name, shape, offset, size, data address) of a whole tensor.
nb::tuple Spec(std::string_view key, DType dtype, const Shape& shape, const void* data) {
  return nb::make_tuple(Str(key), Str(DTypeName(dtype)), ShapeTuple(shape),
                        ShapeTuple(Shape(shape.size(), 0)), ShapeTuple(shape),
                        nb::int_(reinterpret_cast<uintptr_t>(data)));
}

}  // namespace

AskedTensors AskTensors(nb::list keys, nb::list tensors, nb::tuple plain_types,
                        nb::handle strided, nb::dict dtype_names) {
  if (keys.size() != tensors.size()) throw nb::value_error("keys and tensors differ in length");
  TensorQuestions ask(plain_types, strided, dtype_names);
  AskedTensors out;
  out.keys = keys;
  out.count = keys.size();
  out.asked.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    // A key that is not a str is the general path's to deal with.
    const std::optional<std::string_view> key = Utf8Of(keys[i]);
    out.asked.push_back(key ? AskPlain(ask, *key, tensors[i], &out.dims) : AskedTensor{});
  }
  return out;
}

nb::tuple PlanWhole(AskedTensors& asked, const CheckpointSource& src) {
  const PackedTensors& saved = *src.packed;  // open_source and PendingSource pack them
  size_t next = 0;  // keys asked in the index's order are found without a search
  nb::list taken, rest;
  WholeTargets whole;
  whole.tensors = src.packed;
  whole.items.reserve(asked.asked.size());
  PlanEach(
      asked,
      [&](size_t i, const AskedTensor& t) {
        std::optional<size_t> found;
        if (next < saved.size() && saved.key(next) == t.key) {
          found = next;
        } else {
          found = saved.Find(t.key);
        }
        if (!found) return false;
        next = *found + 1;
        const std::span<const uint64_t> dims = asked.DimsOf(t), want = saved.dims(*found);
        if (saved.dtype(*found) != t.dtype ||
            !std::equal(dims.begin(), dims.end(), want.begin(), want.end())) {
          return false;
        }
        whole.items.push_back({static_cast<uint32_t>(*found), t.data});
        taken.append(asked.keys[i]);
        return true;
      },
      &rest);
  return nb::make_tuple(std::move(whole), taken, rest);
}

nb::tuple PlanSaveWhole(AskedTensors& asked) {
  nb::list rest;
  WholeShards whole;
  whole.items.reserve(asked.asked.size());
  PlanEach(
      asked,
      [&](size_t, const AskedTensor& t) {
        const std::span<const uint64_t> dims = asked.DimsOf(t);
        Shape shape(dims.begin(), dims.end());
        Box box = Box::Whole(shape);
        whole.items.push_back(TensorShard{std::string(t.key), t.dtype, std::move(shape),
                                          Slice{std::move(box), {}}, t.data});
        return true;
      },
      &rest);
  return nb::make_tuple(std::move(whole), rest);
}

std::optional<std::string_view> Utf8Of(nb::handle key) {
  Py_ssize_t length = 0;
  const char* utf8 = PyUnicode_Check(key.ptr()) ? PyUnicode_AsUTF8AndSize(key.ptr(), &length)
                                                 : nullptr;
  if (utf8 == nullptr) {
    PyErr_Clear();  // not a str, or not encodable
    return std::nullopt;
  }
  return std::string_view(utf8, static_cast<size_t>(length));
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

nb::list WholeSpecs(const WholeTargets& whole) {
  nb::list out;
  for (const WholeTensorTarget& t : whole.items) {
    const PackedTensors& saved = *whole.tensors;
    out.append(Spec(saved.key(t.tensor), saved.dtype(t.tensor), saved.shape(t.tensor), t.data));
  }
  return out;
}

nb::list WholeSpecs(const WholeShards& whole) {
  nb::list out;
  for (const TensorShard& t : whole.items) out.append(Spec(t.key, t.dtype, t.shape, t.data));
  return out;
}

}  // namespace shardsafe::python
