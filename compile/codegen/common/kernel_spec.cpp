// KernelSpec building, validation, canonical form and structural identity (see kernel_spec.h).
#include "compile/codegen/common/kernel_spec.h"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <tuple>

#include "runtime/error.h"
#include "runtime/sha256.h"

namespace ingot::codegen {

namespace {

constexpr int kFirstUnary = static_cast<int>(Op::Neg);
constexpr int kLastUnary = static_cast<int>(Op::Cast);
constexpr int kFirstBinary = static_cast<int>(Op::Add);
constexpr int kLastBinary = static_cast<int>(Op::RoundBf16Stochastic);
constexpr int kFirstReduce = static_cast<int>(Op::ReduceSum);
constexpr int kLastReduce = static_cast<int>(Op::ReduceMin);

const char* kind_name(KernelKind k) {
  switch (k) {
    case KernelKind::Pointwise: return "pointwise";
    case KernelKind::RowReduction: return "row_reduction";
    case KernelKind::MultiTensor: return "multi_tensor";
  }
  return "?";
}

void append_sym(std::string& s, const SymInt& v) {
  if (v.is_constant())
    s += std::to_string(v.value);
  else
    s += "s" + std::to_string(v.sym);
}

}  // namespace

const char* op_name(Op op) {
  switch (op) {
    case Op::Load: return "load";
    case Op::Const: return "const";
    case Op::Scalar: return "scalar";
    case Op::Index: return "index";
    case Op::Where: return "where";
    case Op::ColumnSum: return "column_sum";
#define INGOT_KERNEL_OP_NAME(name, arity, text) \
  case Op::name: return text;
      INGOT_KERNEL_UNARY_OPS(INGOT_KERNEL_OP_NAME)
      INGOT_KERNEL_BINARY_OPS(INGOT_KERNEL_OP_NAME)
      INGOT_KERNEL_REDUCE_OPS(INGOT_KERNEL_OP_NAME)
#undef INGOT_KERNEL_OP_NAME
  }
  return "?";
}

bool is_unary(Op op) { return static_cast<int>(op) >= kFirstUnary && static_cast<int>(op) <= kLastUnary; }
bool is_binary(Op op) { return static_cast<int>(op) >= kFirstBinary && static_cast<int>(op) <= kLastBinary; }
bool is_reduction(Op op) {
  return static_cast<int>(op) >= kFirstReduce && static_cast<int>(op) <= kLastReduce;
}
bool is_comparison(Op op) {
  return op == Op::Eq || op == Op::Ne || op == Op::Lt || op == Op::Le || op == Op::Gt || op == Op::Ge;
}
int op_arity(Op op) {
  if (op == Op::Where) return 3;
  if (is_binary(op)) return 2;
  if (is_unary(op) || is_reduction(op) || op == Op::ColumnSum) return 1;
  return 0;
}

// --- building --------------------------------------------------------------------------------------------

int KernelSpec::input(DType dtype, std::vector<SymInt> strides, std::string buffer_name) {
  buffers.push_back(Buffer{dtype, std::move(strides), false, -1, std::move(buffer_name)});
  return static_cast<int>(buffers.size()) - 1;
}

int KernelSpec::output(DType dtype, std::vector<SymInt> strides, std::string buffer_name, int alias_of) {
  buffers.push_back(Buffer{dtype, std::move(strides), true, alias_of, std::move(buffer_name)});
  return static_cast<int>(buffers.size()) - 1;
}

std::vector<SymInt> KernelSpec::contiguous_strides() const {
  std::vector<SymInt> st(dims.size());
  int64_t acc = 1;
  for (size_t i = dims.size(); i-- > 0;) {
    INGOT_CHECK(dims[i].is_constant(), "[codegen] kernel '", name, "': contiguous_strides needs constant dims, dim ",
                i, " is sym slot ", dims[i].sym);
    st[i] = SymInt::constant(acc);
    acc *= dims[i].value;
  }
  return st;
}

namespace {
int push(KernelSpec& k, Node n) {
  k.nodes.push_back(n);
  return static_cast<int>(k.nodes.size()) - 1;
}
DType node_dtype(const KernelSpec& k, int id, const char* what) {
  INGOT_CHECK(id >= 0 && id < static_cast<int>(k.nodes.size()), "[codegen] kernel '", k.name, "': ", what,
              " operand ", id, " is not a node id (have ", k.nodes.size(), " nodes)");
  return k.nodes[id].dtype;
}
}  // namespace

int KernelSpec::load(int buffer) {
  INGOT_CHECK(buffer >= 0 && buffer < static_cast<int>(buffers.size()), "[codegen] kernel '", name, "': load of buffer ",
              buffer, ", have ", buffers.size());
  return push(*this, Node{Op::Load, buffers[buffer].dtype, -1, -1, -1, buffer, 0});
}
int KernelSpec::constant(double v, DType dtype) { return push(*this, Node{Op::Const, dtype, -1, -1, -1, -1, v}); }
int KernelSpec::scalar(int slot, DType dtype) {
  num_scalars = std::max(num_scalars, slot + 1);
  return push(*this, Node{Op::Scalar, dtype, -1, -1, -1, slot, 0});
}
int KernelSpec::index(int dim) { return push(*this, Node{Op::Index, DType::i64, -1, -1, -1, dim, 0}); }
int KernelSpec::unary(Op op, int a) {
  INGOT_CHECK(is_unary(op) && op != Op::Cast, "[codegen] kernel '", name, "': unary() got op ", op_name(op));
  DType t = node_dtype(*this, a, op_name(op));
  return push(*this, Node{op, op == Op::Not ? DType::b8 : t, a, -1, -1, -1, 0});
}
int KernelSpec::cast(int a, DType dtype) {
  node_dtype(*this, a, "cast");
  return push(*this, Node{Op::Cast, dtype, a, -1, -1, -1, 0});
}
int KernelSpec::binary(Op op, int a, int b) {
  INGOT_CHECK(is_binary(op), "[codegen] kernel '", name, "': binary() got op ", op_name(op));
  DType t = promote(node_dtype(*this, a, op_name(op)), node_dtype(*this, b, op_name(op)));
  if (is_comparison(op) || op == Op::And || op == Op::Or) t = DType::b8;
  if (op == Op::RoundBf16Stochastic) t = DType::f32;
  return push(*this, Node{op, t, a, b, -1, -1, 0});
}
int KernelSpec::where(int cond, int a, int b) {
  node_dtype(*this, cond, "where");
  DType t = promote(node_dtype(*this, a, "where"), node_dtype(*this, b, "where"));
  return push(*this, Node{Op::Where, t, cond, a, b, -1, 0});
}
int KernelSpec::reduce(Op op, int a) {
  INGOT_CHECK(is_reduction(op), "[codegen] kernel '", name, "': reduce() got op ", op_name(op));
  return push(*this, Node{op, node_dtype(*this, a, op_name(op)), a, -1, -1, -1, 0});
}
int KernelSpec::column_sum(int a) {
  return push(*this, Node{Op::ColumnSum, node_dtype(*this, a, "column_sum"), a, -1, -1, -1, 0});
}
void KernelSpec::store(int buffer, int node) { stores.push_back(Store{buffer, node}); }

// --- validation ------------------------------------------------------------------------------------------

std::vector<bool> element_level_nodes(const KernelSpec& k) {
  std::vector<bool> el(k.nodes.size(), k.kind != KernelKind::RowReduction);
  if (k.kind != KernelKind::RowReduction) return el;
  const int last = static_cast<int>(k.dims.size()) - 1;
  for (size_t i = 0; i < k.nodes.size(); ++i) {
    const Node& n = k.nodes[i];
    if (is_reduction(n.op) || n.op == Op::ColumnSum) continue;  // one value per row / per column
    if (n.op == Op::Load) {
      const SymInt& s = k.buffers[n.arg].strides[last];
      el[i] = !(s.is_constant() && s.value == 0);
    } else if (n.op == Op::Index) {
      el[i] = n.arg == last;
    } else {
      for (int o : {n.a, n.b, n.c})
        if (o >= 0 && el[o]) el[i] = true;
    }
  }
  return el;
}

namespace {

// The checks of KernelSpec::validate, each naming the kernel (prefix) and what it found broken.

void check_sym(const KernelSpec& k, const std::string& prefix, const SymInt& s, const std::string& what) {
  if (s.is_constant()) {
    INGOT_CHECK(s.value >= 0, prefix, what, " is negative: ", s.value);
  } else {
    INGOT_CHECK(k.kind != KernelKind::MultiTensor, prefix, what, " uses sym slot ", s.sym,
                " but multi-tensor kernels have no sym slots of their own");
    INGOT_CHECK(s.sym < k.num_syms, prefix, what, " uses sym slot ", s.sym, " but num_syms is ", k.num_syms);
  }
}

void check_dims(const KernelSpec& k, const std::string& prefix) {
  const size_t nd = k.dims.size();
  if (k.kind == KernelKind::RowReduction)
    INGOT_CHECK(nd >= 1, prefix, "a row reduction needs at least one dim (the reduced one), got none");
  if (k.kind == KernelKind::MultiTensor)
    INGOT_CHECK(nd == 0, prefix, "a multi-tensor kernel has no dims (sizes come at run time), got ", nd);
  for (size_t d = 0; d < nd; ++d) check_sym(k, prefix, k.dims[d], "dim " + std::to_string(d));
}

// Note [Column sums in row reductions]: the buffers stored from ColumnSum nodes (column outputs).
std::vector<bool> column_outputs(const KernelSpec& k) {
  std::vector<bool> column_out(k.buffers.size(), false);
  for (const Store& s : k.stores)
    if (s.buffer >= 0 && s.buffer < static_cast<int>(k.buffers.size()) && s.node >= 0 &&
        s.node < static_cast<int>(k.nodes.size()) && k.nodes[s.node].op == Op::ColumnSum)
      column_out[s.buffer] = true;
  return column_out;
}

void check_buffer(const KernelSpec& k, const std::string& prefix, size_t b, bool column_out) {
  const size_t nd = k.dims.size();
  const Buffer& buf = k.buffers[b];
  const std::string what = "buffer " + std::to_string(b) + " ('" + buf.name + "')";
  const size_t want = k.kind == KernelKind::MultiTensor ? 0 : nd;
  INGOT_CHECK(buf.strides.size() == want, prefix, what, " has ", buf.strides.size(), " strides, expected ", want);
  for (size_t d = 0; d < buf.strides.size(); ++d) {
    // Negative strides are legal index maps (a flip), so only syms are range-checked here.
    if (!buf.strides[d].is_constant()) check_sym(k, prefix, buf.strides[d], what + " stride " + std::to_string(d));
  }
  if (buf.alias_of >= 0) {
    INGOT_CHECK(buf.is_output, prefix, what, " is an input but has alias_of set");
    INGOT_CHECK(buf.alias_of < static_cast<int>(k.buffers.size()) && !k.buffers[buf.alias_of].is_output, prefix,
                what, " aliases buffer ", buf.alias_of, ", which is not an input");
    const Buffer& in = k.buffers[buf.alias_of];
    INGOT_CHECK(in.strides == buf.strides && in.dtype == buf.dtype, prefix, what, " is in place on buffer ",
                buf.alias_of, " but their dtype or index map differ");
  }
  if (column_out) {
    for (size_t d = 0; d + 1 < nd; ++d)
      INGOT_CHECK(buf.strides[d].is_constant() && buf.strides[d].value == 0, prefix, what,
                  " holds column sums but its stride along row dim ", d, " is not 0");
    INGOT_CHECK(!(buf.strides[nd - 1].is_constant() && buf.strides[nd - 1].value == 0) && buf.alias_of < 0, prefix,
                what, " holds column sums but is not a dense column output");
  } else if (buf.is_output && k.kind != KernelKind::MultiTensor) {
    // A broadcast output would be written by several points (a race); only RowReduction's row outputs,
    // with a 0 stride on the last dim, are written once per row by construction.
    for (size_t d = 0; d < nd; ++d) {
      const bool row_out_dim = k.kind == KernelKind::RowReduction && d + 1 == nd;
      const SymInt& s = buf.strides[d];
      const bool unit_dim = k.dims[d].is_constant() && k.dims[d].value <= 1;
      INGOT_CHECK(row_out_dim || unit_dim || !(s.is_constant() && s.value == 0), prefix, what,
                  " is an output broadcast along dim ", d, " (stride 0): several points would write one element");
    }
  }
}

void check_node(const KernelSpec& k, const std::string& prefix, size_t i) {
  const Node& n = k.nodes[i];
  const std::string what = "node " + std::to_string(i) + " (" + op_name(n.op) + ")";
  const int arity = op_arity(n.op);
  const int ops[3] = {n.a, n.b, n.c};
  for (int j = 0; j < 3; ++j) {
    if (j < arity) {
      INGOT_CHECK(ops[j] >= 0 && ops[j] < static_cast<int>(i), prefix, what, " operand ", j, " is ", ops[j],
                  ": operands must be earlier nodes");
      INGOT_CHECK(k.nodes[ops[j]].op != Op::ColumnSum, prefix, what, " reads column sum ", ops[j],
                  "; column sums may only be stored");
    } else {
      INGOT_CHECK(ops[j] == -1, prefix, what, " has ", arity, " operands but operand ", j, " is set");
    }
  }
  switch (n.op) {
    case Op::Load:
      INGOT_CHECK(n.arg >= 0 && n.arg < static_cast<int>(k.buffers.size()) && !k.buffers[n.arg].is_output, prefix,
                  what, " reads buffer ", n.arg, ", which is not an input");
      INGOT_CHECK(n.dtype == k.buffers[n.arg].dtype, prefix, what, " has dtype ", dtype_name(n.dtype), " but buffer ",
                  n.arg, " is ", dtype_name(k.buffers[n.arg].dtype));
      break;
    case Op::Scalar:
      INGOT_CHECK(n.arg >= 0 && n.arg < k.num_scalars, prefix, what, " reads scalar slot ", n.arg,
                  " but num_scalars is ", k.num_scalars);
      break;
    case Op::Index: {
      const int ndim = k.kind == KernelKind::MultiTensor ? 1 : static_cast<int>(k.dims.size());
      INGOT_CHECK(n.arg >= 0 && n.arg < ndim, prefix, what, " indexes dim ", n.arg, " of ", ndim);
      INGOT_CHECK(n.dtype == DType::i64, prefix, what, " must be i64");
      break;
    }
    case Op::Where:
      INGOT_CHECK(k.nodes[n.a].dtype == DType::b8, prefix, what, " condition must be b8, got ",
                  dtype_name(k.nodes[n.a].dtype));
      break;
    case Op::ColumnSum:
      INGOT_CHECK(k.kind == KernelKind::RowReduction, prefix, what, " is a column sum in a ", kind_name(k.kind),
                  " kernel");
      INGOT_CHECK(n.dtype == DType::f32 || n.dtype == DType::bf16 || n.dtype == DType::f16, prefix, what, " sums ",
                  dtype_name(n.dtype), " values; column sums take bf16, f16 or f32");
      break;
    default:
      if (is_reduction(n.op)) {
        INGOT_CHECK(k.kind == KernelKind::RowReduction, prefix, what, " is a reduction in a ", kind_name(k.kind),
                    " kernel");
        INGOT_CHECK(n.dtype != DType::b8, prefix, what, " cannot reduce b8 values");
      }
      break;
  }
}

void check_stores(const KernelSpec& k, const std::string& prefix, const std::vector<bool>& column_out) {
  INGOT_CHECK(!k.stores.empty(), prefix, "stores nothing");
  const size_t nd = k.dims.size();
  const std::vector<bool> el = element_level_nodes(k);
  std::vector<int> stored(k.buffers.size(), 0);
  for (const Store& s : k.stores) {
    INGOT_CHECK(s.buffer >= 0 && s.buffer < static_cast<int>(k.buffers.size()) && k.buffers[s.buffer].is_output,
                prefix, "store into buffer ", s.buffer, ", which is not an output");
    INGOT_CHECK(s.node >= 0 && s.node < static_cast<int>(k.nodes.size()), prefix, "store into buffer ", s.buffer,
                " of node ", s.node, ", which does not exist");
    const std::string& name = k.buffers[s.buffer].name;
    INGOT_CHECK(++stored[s.buffer] == 1, prefix, "buffer ", s.buffer, " ('", name, "') is stored twice");
    INGOT_CHECK(column_out[s.buffer] == (k.nodes[s.node].op == Op::ColumnSum), prefix, "buffer ", s.buffer, " ('",
                name, "') stores node ", s.node, ": a column output takes column sums only");
    if (k.kind == KernelKind::RowReduction && !column_out[s.buffer]) {
      const SymInt& cs = k.buffers[s.buffer].strides[nd - 1];
      const bool row_output = cs.is_constant() && cs.value == 0;
      INGOT_CHECK(!row_output || !el[s.node], prefix, "buffer ", s.buffer, " ('", name,
                  "') is a row output (last-dim stride 0) but node ", s.node,
                  " depends on the reduced dim; reduce it first");
    }
  }
  for (size_t b = 0; b < k.buffers.size(); ++b)
    INGOT_CHECK(!k.buffers[b].is_output || stored[b] == 1, prefix, "output buffer ", b, " ('", k.buffers[b].name,
                "') is never stored");
}

}  // namespace

void KernelSpec::validate() const {
  const std::string prefix = "[codegen] kernel '" + name + "': ";
  check_dims(*this, prefix);
  const std::vector<bool> column_out = column_outputs(*this);
  for (size_t b = 0; b < buffers.size(); ++b) check_buffer(*this, prefix, b, column_out[b]);
  for (size_t i = 0; i < nodes.size(); ++i) check_node(*this, prefix, i);
  check_stores(*this, prefix, column_out);
}

// --- canonical form and identity -------------------------------------------------------------------------

KernelSpec canonicalize(const KernelSpec& k) {
  KernelSpec out = k;
  out.nodes.clear();
  out.stores.clear();
  std::vector<int> remap(k.nodes.size(), -1);
  // Structural dedup: two nodes with the same op, dtype, attributes and (already canonical) operands are one.
  std::map<std::tuple<int, int, int, int, int, int, uint64_t>, int> seen;
  auto visit = [&](auto& self, int id) -> int {
    if (remap[id] >= 0) return remap[id];
    Node n = k.nodes[id];
    if (n.a >= 0) n.a = self(self, n.a);
    if (n.b >= 0) n.b = self(self, n.b);
    if (n.c >= 0) n.c = self(self, n.c);
    uint64_t bits = 0;
    static_assert(sizeof(bits) == sizeof(n.value));
    std::memcpy(&bits, &n.value, sizeof bits);
    auto key = std::make_tuple(static_cast<int>(n.op), static_cast<int>(n.dtype), n.a, n.b, n.c, n.arg, bits);
    auto it = seen.find(key);
    if (it != seen.end()) return remap[id] = it->second;
    out.nodes.push_back(n);
    const int nid = static_cast<int>(out.nodes.size()) - 1;
    seen.emplace(key, nid);
    return remap[id] = nid;
  };
  std::vector<Store> stores = k.stores;
  std::stable_sort(stores.begin(), stores.end(), [](const Store& x, const Store& y) { return x.buffer < y.buffer; });
  for (const Store& s : stores) {
    INGOT_CHECK(s.node >= 0 && s.node < static_cast<int>(k.nodes.size()), "[codegen] kernel '", k.name,
                "': store of node ", s.node, ", which does not exist");
    out.stores.push_back(Store{s.buffer, visit(visit, s.node)});
  }
  return out;
}

std::string KernelSpec::structural_key() const {
  const KernelSpec c = canonicalize(*this);
  std::string s = kind_name(c.kind);
  s += " dims[";
  for (const SymInt& d : c.dims) append_sym(s, d), s += ',';
  s += "] syms=" + std::to_string(c.num_syms) + " scalars=" + std::to_string(c.num_scalars) + "\n";
  for (const Buffer& b : c.buffers) {
    s += b.is_output ? "out " : "in ";
    s += dtype_name(b.dtype);
    s += " [";
    for (const SymInt& st : b.strides) append_sym(s, st), s += ',';
    s += "]";
    if (b.alias_of >= 0) s += " alias=" + std::to_string(b.alias_of);
    s += "\n";
  }
  char buf[64];
  for (const Node& n : c.nodes) {
    s += op_name(n.op);
    s += ' ';
    s += dtype_name(n.dtype);
    for (int o : {n.a, n.b, n.c})
      if (o >= 0) s += ' ' + std::to_string(o);
    if (n.arg >= 0) s += " #" + std::to_string(n.arg);
    if (n.op == Op::Const) {
      std::snprintf(buf, sizeof buf, " %a", n.value);  // hex float: exact
      s += buf;
    }
    s += '\n';
  }
  for (const Store& st : c.stores) s += "store " + std::to_string(st.buffer) + " " + std::to_string(st.node) + "\n";
  return s;
}

namespace {
uint64_t structural_hash_of(const std::string& key) { return Key64().add(key).value(); }
}  // namespace

uint64_t KernelSpec::structural_hash() const { return structural_hash_of(structural_key()); }

std::string KernelSpec::symbol() const {
  std::string s;
  for (char ch : name) {
    const char lc = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    s += (std::isalnum(static_cast<unsigned char>(lc)) || lc == '_') ? lc : '_';
  }
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "k" + s;
  if (s.size() > 48) s.resize(48);
  char buf[24];
  std::snprintf(buf, sizeof buf, "_%016" PRIx64, structural_hash());
  return s + buf;
}

}  // namespace ingot::codegen
