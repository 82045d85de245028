// KernelSpec: the description of ONE fused loop kernel, backend-neutral. It is the contract between the
// compiler core (which decides what fuses and lowers a group of graph nodes into a KernelSpec) and the code
// generators (compile/codegen/cpu renders it to C++, the GPU issue renders it to CUDA).
//
// A KernelSpec says three things:
//   1. the iteration space: the loops the kernel runs (sizes constant or given at run time);
//   2. the buffers: every tensor the kernel reads or writes, each with a dtype and an index map, i.e. one
//      stride per loop dim (stride 0 = broadcast along that dim);
//   3. an expression DAG of scalar ops evaluated at every point of the iteration space, whose results are
//      stored into the output buffers.
//
// Three kinds share that form:
//
// Pointwise      loops dims[0..n); every node is evaluated at each point; outputs are stored at each point.
//                e.g. gelu(x + b) with b broadcast:   dims {R, C}; x strides {C, 1}; b strides {0, 1}.
//
// RowReduction   the LAST dim is the reduced one ("cols"), all dims before it are "rows" (run in parallel).
//                Nodes of kind ReduceSum/ReduceMax/... reduce their operand over the cols of one row and give
//                a row-level value usable by every later node: a pointwise PROLOGUE feeds the reduction and an
//                EPILOGUE can use the reduced value, with several reductions per row, chained or not:
//                   softmax:    m = max(x); s = sum(exp(x - m)); y = exp(x - m) / s
//                   layer_norm: mu = sum(x) / C; var = sum(square(x - mu)) / C; y = (x - mu) * rsqrt(var + eps) * w + b
//                   ce fwd:     m = max(z); lse = m + log(sum(exp(z - m))); zt = sum(where(col == t, z, 0));
//                               loss = lse - zt   (a row-level output)
//                A value depends on the cols ("element level") when it reads a buffer whose col stride is not 0
//                or the col Index; otherwise it is "row level". An output whose col stride is 0 is a ROW
//                OUTPUT: it is written once per row and its value must be row level (e.g. lse, mean, rstd,
//                per-row loss). An output with a non-zero col stride is written at every (row, col).
//                A reduction over a non-last dim (layer_norm's dw = sum over rows) is expressed by choosing
//                the dims so that the reduced one is last (strides make this a transpose, no copy).
//                COLUMN SUMS (Note [Column sums in row reductions]): a ColumnSum node adds its element-level
//                operand over every row, one value per column; it may only be stored, into a COLUMN OUTPUT
//                (stride 0 on every row dim), and read by no other node. A layer norm's dx kernel computes
//                dw and db with them from the values it already loads. The CUDA backend only.
//                A full reduction to one value is rows = 1 (a single dim {N}: zero row dims).
//
// MultiTensor    "horizontal" fusion: the same expression over a LIST of tensors of different sizes, e.g.
//                the AdamW update of every parameter in one kernel. Each list entry ("tensor t") has one
//                buffer per buffer slot of the spec (param, grad, m, v), all dense (contiguous) and of
//                numel n_t; the expression is evaluated at every element i < n_t of every t. dims and strides
//                are unused (leave them empty); the number of tensors and their sizes are run-time values.
//                Scalars are shared by all tensors: tensors whose hyper-parameters differ (a parameter group
//                without weight decay) go to separate kernels, or the difference becomes an input buffer.
//
// A Pointwise output must not be broadcast (a 0 stride on a dim whose size is not the constant 1): every
// point writes a distinct element, which is what lets the loops run in parallel.
//
// Loads read the buffer at the index map of the current point: sum over d of index[d] * strides[d] (in
// elements, from the buffer's base pointer, which the caller has already offset to the tensor's first
// element). Outputs are stored the same way. An output may share memory with an input (in-place update:
// set Buffer::alias_of) only with an identical index map; the generated code then reads before it writes
// each element and drops __restrict__ on both. Buffers not linked by alias_of must not overlap in memory
// (the code promises the C++ compiler they do not).
//
// Numerics (what the eager kernels do, so compiled results match them within rounding):
//   - every node has a dtype: the dtype of its value. bf16/f16/f32 nodes are computed in float, f64 nodes in
//     double, i32/i64 in int64_t, b8 in bool. Loads widen, stores narrow (round to nearest even).
//   - intermediate bf16/f16 nodes are NOT rounded (as in Inductor: fusing removes the stores that would
//     round); an explicit Cast to bf16/f16 DOES round (x -> bf16 -> float), so a lowering can reproduce an
//     eager round trip where it matters (e.g. casting fp32 master weights to bf16).
//   - reductions accumulate in the compute type (float for bf16/f16/f32 inputs, double for f64).
//
// Run-time values (dynamic shapes, hyper-parameters) never change the generated code:
//   - SymInt is a size or stride that is either a constant or slot k of the `syms` array passed at call
//     time. Use a slot for dims marked dynamic and for strides derived from them; everything else constant
//     (constants let the C++ compiler vectorize and unroll).
//   - a Scalar node reads scalars[k] (a double) at run time: learning rate, step count, bias corrections.
//     Never bake a value that changes between steps into a Const.
//
// Calling convention of a generated kernel (a plain C ABI, the same on every backend):
//     extern "C" void <symbol>(void* const* bufs, const int64_t* syms, const double* scalars);
//   Pointwise / RowReduction: bufs[b] is the base pointer of buffer b (spec order); syms[k] is sym slot k.
//   MultiTensor: syms[0] = number of tensors T, syms[1 + t] = numel of tensor t;
//                bufs[t * buffers.size() + b] is buffer slot b of tensor t.
//   Buffers are the inputs and outputs in one list; Buffer::is_output tells which.
//
// Identity: structural_key() is a canonical text of everything that affects the generated code (kind,
// sizes, buffer dtypes/strides/aliasing, the DAG by structure) and nothing else: names are excluded and node
// order does not matter (the DAG is canonicalized, dead nodes dropped, duplicate nodes merged), so the same
// kernel lowered from layer 3 or from another graph gives the same key. structural_hash() hashes that key; it
// names the kernel symbol and the compile cache entry. Equal keys mean identical generated code.
//
// Building: the member functions below append nodes and return their id (an index into `nodes`); operand
// ids must be smaller than the new node's id (nodes are in topological order). Dtypes of results are
// inferred (see each function). validate() checks every rule stated here and throws ingot::Error naming the
// kernel, the node and the rule; the code generators call it first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/dtype.h"

namespace ingot::codegen {

enum class KernelKind : uint8_t { Pointwise, RowReduction, MultiTensor };

// A size or stride: a constant, or slot `sym` of the run-time syms array.
struct SymInt {
  int64_t value = 0;
  int32_t sym = -1;  // >= 0: read syms[sym] at run time; value is then ignored (keep it 0)

  static SymInt constant(int64_t v) { return SymInt{v, -1}; }
  static SymInt slot(int32_t k) { return SymInt{0, k}; }
  bool is_constant() const { return sym < 0; }
  bool operator==(const SymInt&) const = default;
};

// One tensor argument of the kernel.
struct Buffer {
  DType dtype = DType::f32;
  std::vector<SymInt> strides;  // one per dim of the iteration space, in elements; 0 = broadcast. Empty for
                                // MultiTensor (dense).
  bool is_output = false;
  int32_t alias_of = -1;  // outputs only: the input buffer this output shares memory with (in-place), or -1
  std::string name;       // for the generated code's comments and errors; not part of the identity
};

// The scalar ops, as X(Name, arity, "printed name"). The renderers map each one to their language; the
// kind of op (leaf / unary / binary / ternary / reduction) is its arity and its place in this list. Ops whose
// formula is more than one operator (sigmoid, the GELUs, the activation gradients) render as calls of
// runtime/kernels/scalar_math.h, the eager kernels' own definitions (Note [Scalar math written once]).
#define INGOT_KERNEL_UNARY_OPS(X)                                                               \
  X(Neg, 1, "neg") X(Abs, 1, "abs") X(Exp, 1, "exp") X(Log, 1, "log") X(Log1p, 1, "log1p")      \
  X(Expm1, 1, "expm1") X(Sqrt, 1, "sqrt") X(Rsqrt, 1, "rsqrt") X(Reciprocal, 1, "reciprocal")   \
  X(Square, 1, "square") X(Sin, 1, "sin") X(Cos, 1, "cos") X(Tanh, 1, "tanh") X(Erf, 1, "erf")  \
  X(Sigmoid, 1, "sigmoid") X(Relu, 1, "relu") X(GeluTanh, 1, "gelu_tanh") X(GeluErf, 1, "gelu")  \
  X(Silu, 1, "silu") X(Sign, 1, "sign") X(Floor, 1, "floor") X(Not, 1, "not")                   \
  X(Cast, 1, "cast")
#define INGOT_KERNEL_BINARY_OPS(X)                                                              \
  X(Add, 2, "add") X(Sub, 2, "sub") X(Mul, 2, "mul") X(Div, 2, "div") X(Pow, 2, "pow")          \
  X(Max, 2, "max") X(Min, 2, "min") X(Eq, 2, "eq") X(Ne, 2, "ne") X(Lt, 2, "lt") X(Le, 2, "le") \
  X(Gt, 2, "gt") X(Ge, 2, "ge") X(And, 2, "and") X(Or, 2, "or")                                 \
  /* activation gradients (a = x, or the output for sigmoid / tanh; b = dy): scalar_math.h's */ \
  X(ReluGrad, 2, "relu_grad") X(SigmoidGrad, 2, "sigmoid_grad") X(TanhGrad, 2, "tanh_grad")     \
  X(SiluGrad, 2, "silu_grad") X(GeluTanhGrad, 2, "gelu_tanh_grad") X(GeluErfGrad, 2, "gelu_grad")          \
  /* a = an f32 value, b = an i64 salt: a rounded stochastically to a bf16 value (scalar_math.h's             \
     round_bf16_stochastic, Note [Stochastic rounding]); f32 result */                                          \
  X(RoundBf16Stochastic, 2, "round_bf16_stochastic")
#define INGOT_KERNEL_REDUCE_OPS(X) \
  X(ReduceSum, 1, "reduce_sum") X(ReduceMax, 1, "reduce_max") X(ReduceMin, 1, "reduce_min")

enum class Op : uint8_t {
  // leaves
  Load,    // buffers[arg] at the current point (arg = an input buffer)
  Const,   // the literal `value`, of the node's dtype
  Scalar,  // scalars[arg] at run time, converted to the node's dtype
  Index,   // the loop index along dim `arg` (i64); MultiTensor: arg 0 is the element index within a tensor
#define INGOT_KERNEL_OP_ENUM(name, arity, text) name,
  INGOT_KERNEL_UNARY_OPS(INGOT_KERNEL_OP_ENUM)
  Where,  // a ? b : c (a is b8)
  INGOT_KERNEL_BINARY_OPS(INGOT_KERNEL_OP_ENUM)
  INGOT_KERNEL_REDUCE_OPS(INGOT_KERNEL_OP_ENUM)
#undef INGOT_KERNEL_OP_ENUM
  ColumnSum,  // RowReduction: the sum of its operand over every row, per column (see COLUMN SUMS above)
};

const char* op_name(Op op);
int op_arity(Op op);  // number of node operands: 0 for leaves, 1..3 otherwise
bool is_unary(Op op);
bool is_binary(Op op);
bool is_reduction(Op op);
bool is_comparison(Op op);  // Eq..Ge: b8 result

struct Node {
  Op op = Op::Const;
  DType dtype = DType::f32;
  int32_t a = -1, b = -1, c = -1;  // operand node ids (by arity)
  int32_t arg = -1;                // Load: buffer; Scalar: scalar slot; Index: dim
  double value = 0;                // Const
};

// What to store where: buffers[buffer] (an output) receives node `node`, converted to the buffer's dtype.
struct Store {
  int32_t buffer = -1;
  int32_t node = -1;
};

struct KernelSpec {
  KernelKind kind = KernelKind::Pointwise;
  std::vector<SymInt> dims;  // iteration space (outermost first); RowReduction: rows..., cols
  std::vector<Buffer> buffers;
  std::vector<Node> nodes;  // topological order: operands before users
  std::vector<Store> stores;
  int32_t num_scalars = 0;  // length of the scalars array the kernel reads
  int32_t num_syms = 0;     // length of the syms array (Pointwise/RowReduction; MultiTensor: 1 + T at run time)
  std::string name;         // readable, e.g. "ln_gelu_fwd"; becomes part of the symbol; not part of identity

  // --- building -------------------------------------------------------------------------------------------
  // Adds a buffer; returns its index. strides must have dims.size() entries (none for MultiTensor).
  int input(DType dtype, std::vector<SymInt> strides, std::string name = {});
  int output(DType dtype, std::vector<SymInt> strides, std::string name = {}, int alias_of = -1);
  // Dense row-major strides for `dims`; every dim must be constant (a dynamic layout passes explicit SymInt
  // strides, slots whose values the caller computes).
  std::vector<SymInt> contiguous_strides() const;

  int load(int buffer);                   // dtype = buffer's dtype
  int constant(double value, DType dtype);
  int scalar(int slot, DType dtype);      // grows num_scalars as needed
  int index(int dim);                     // i64
  int unary(Op op, int a);                // dtype of a (Not: b8)
  int cast(int a, DType dtype);
  int binary(Op op, int a, int b);        // promote(a, b); comparisons, And, Or: b8
  int where(int cond, int a, int b);      // promote(a, b)
  int reduce(Op op, int a);               // RowReduction only; dtype of a
  int column_sum(int a);                  // RowReduction only; dtype of a (bf16 / f16 / f32)
  void store(int buffer, int node);

  // --- checking and identity ------------------------------------------------------------------------------
  void validate() const;  // throws ingot::Error "[codegen] kernel '<name>': ..." on any broken rule
  std::string structural_key() const;
  uint64_t structural_hash() const;
  // "<name>_<16 hex digits of the hash>" (name sanitized to [a-z0-9_]): the exported C symbol.
  std::string symbol() const;
};

// The same kernel with its DAG canonicalized: nodes reachable from the stores only, duplicates merged,
// ordered by a depth-first walk from the stores in order. Buffers, dims and names are kept. Code generators
// render the canonical form so that equal structural keys give identical code.
KernelSpec canonicalize(const KernelSpec& spec);

// Row level vs element level (see RowReduction above): true for each node that depends on the last dim.
// ColumnSum nodes are neither (one value per column): false.
std::vector<bool> element_level_nodes(const KernelSpec& spec);

}  // namespace ingot::codegen
