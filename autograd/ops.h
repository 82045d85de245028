// Differentiable tensor operations: the functions users and models call. Each is built from one primitive
// defined in autograd/ops/<family>.cpp (shape rule, eager kernels via runtime/kernels, VJP).
// All functions accept tensors on one device; broadcasting follows numpy; dims may be negative.
#pragma once

#include <optional>
#include <vector>

#include "autograd/primitive.h"

namespace ingot {

// pointwise (autograd/ops/pointwise.cpp) -------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double s);
Tensor mul(const Tensor& a, double s);
Tensor pow(const Tensor& a, double exponent);
Tensor rsub(const Tensor& a, double s);  // s - a
Tensor rdiv(const Tensor& a, double s);  // s / a
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool approximate_tanh = true);
Tensor silu(const Tensor& a);
Tensor relu2(const Tensor& a);  // relu(a)^2 (squared ReLU: Primer, modded-nanogpt)
// silu(a) * b as one op (SwiGLU): a and b of one shape and floating dtype; its backward keeps a and b only.
Tensor silu_mul(const Tensor& a, const Tensor& b);
// silu(a + da) * (b + db) with the sums in f32 and one rounding (Note [SwiGLU of sums], autograd/ops/pointwise.cpp):
// a LoRA MLP's gate and up outputs as base + adapter update. Four operands of one shape and floating dtype.
Tensor silu_mul_sums(const Tensor& a, const Tensor& da, const Tensor& b, const Tensor& db);
// gelu(a + da) (tanh approximation) with the sum in f32 and one rounding: GPT-2's c_fc as base + adapter update.
Tensor gelu_tanh_sum(const Tensor& a, const Tensor& da);
Tensor sin(const Tensor& a);
Tensor cos(const Tensor& a);
Tensor square(const Tensor& a);
Tensor reciprocal(const Tensor& a);
// Comparisons and logic return bool tensors and have no gradient.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor cast(const Tensor& a, DType dtype);  // differentiable dtype conversion
Tensor to_device(const Tensor& a, Device d);  // differentiable device move
Tensor clone(const Tensor& a);
// Reduces `grad` (a broadcast result) back to `shape` by summing the broadcast dims (the VJP of broadcasting).
Tensor sum_to_shape(const Tensor& grad, const Shape& shape);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }

// reductions (autograd/ops/reduce.cpp); an empty dims list means all dims ----------------------------------
Tensor sum(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor logsumexp(const Tensor& a, std::vector<int64_t> dims, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);  // i64, no gradient
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);

// matrix products (autograd/ops/matmul.cpp) ------------------------------------------------------------------
// numpy matmul semantics: 1-D operands are promoted, leading dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,M,K] @ [B,K,N]
// x [..., in] @ w[out, in]^T + b[out] (b may be undefined).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());

// normalization and activations over the last dim (autograd/ops/norm.cpp) -------------------------------------
Tensor softmax(const Tensor& a, int64_t dim = -1);
Tensor log_softmax(const Tensor& a, int64_t dim = -1);
// weight / bias may be undefined. Statistics are computed in f32 whatever the input dtype.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);

// losses (autograd/ops/loss.cpp) ------------------------------------------------------------------------------
enum class Reduction { None, Mean, Sum };
// logits [N, C] (or [..., C] flattened), target [N] i64. Mean divides by the number of non-ignored targets.
Tensor cross_entropy(const Tensor& logits, const Tensor& target, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::Mean);
// cross_entropy(linear(x, w), target) without the [N, V] logits (Note [Logits in chunks], loss.cpp): x [..., H],
// w [V, H] of x's dtype; target x's leading shape, i64. The logits are made chunk_rows rows at a time (0: 256 MiB of
// them a chunk); with grad mode the forward computes the gradients of x and w that need one too (w's only with
// reduction mean or sum). Per-row losses and reductions as cross_entropy's.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& target, int64_t ignore_index = -100,
                            double label_smoothing = 0.0, Reduction reduction = Reduction::Mean,
                            int64_t chunk_rows = 0);
Tensor mse_loss(const Tensor& a, const Tensor& b);

// shape and views (autograd/ops/shape.cpp); views alias storage ----------------------------------------------
Tensor reshape(const Tensor& a, Shape shape);  // one dim may be -1; copies only when a view is impossible
Tensor view(const Tensor& a, Shape shape);     // must be expressible as a view
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, std::vector<int64_t> dims);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor expand(const Tensor& a, Shape shape);  // -1 keeps a dim
Tensor contiguous(const Tensor& a);
Tensor cat(const std::vector<Tensor>& ts, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& ts, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_sizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim = 0);
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);

// indexing (autograd/ops/index.cpp); index tensors are i64 or i32 ---------------------------------------------
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor embedding(const Tensor& weight, const Tensor& ids);  // weight [V, D], ids [...] -> [..., D]
// Vocabulary-parallel embeddings (Note [Vocabulary-parallel embeddings], distributed/fsdp.h): `rows` [R, D] are
// rows [base, base + R) of a [vocab, D] table. out = ids.shape + [D] in dtype `as` (rows' by default): each id's row
// when it lies in that range, zeros for the others (rows another rank holds). ids must lie in [0, vocab) (checked
// on the host, as embedding). Differentiable in rows, with embedding_rows_grad as the gradient.
Tensor embedding_rows(const Tensor& rows, const Tensor& ids, int64_t base, int64_t vocab,
                      std::optional<DType> as = std::nullopt);
// Zeros [num_rows, D] in `dtype` plus, for every id in [base, base + num_rows), g's row of that id (accumulated in
// `dtype`: f32 gradients of bf16 lookups); g is ids.shape + [D].
Tensor embedding_rows_grad(const Tensor& g, const Tensor& ids, int64_t base, int64_t num_rows, DType dtype);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// a + scatter of src into a along dim at index (out-of-place).
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);

// transformer pieces (autograd/ops/attention.cpp, autograd/ops/random.cpp) ------------------------------------
// Rotary embedding of x [B, H, T, D] with cos/sin tables [T, D/2] (see rope_tables), or [B, T, D/2] for per-row
// positions (a table gathered at each token's position: packed documents). With an addend (x's shape and dtype),
// x + addend is rotated, summed in f32 and rounded once (Note [Rope of a sum]: a LoRA projection's base and delta).
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& addend = Tensor());
// cos/sin tables [T, D/2] for positions start..start+T; rope_scaling handled by the caller via inv_freq.
std::pair<Tensor, Tensor> rope_tables(int64_t seq_len, int64_t head_dim, double theta, Device device,
                                      int64_t start = 0, const Tensor& inv_freq = Tensor());
// q [B, Hq, T, D], k, v [B, Hkv, S, D]; returns [B, Hq, T, D]. scale defaults to 1/sqrt(D). positions
// (causal only; integer [B, T]): each query's position within its document, counted from 0 where the document
// starts in the row; a query attends only to the keys of its own document (packed rows). Undefined: no
// documents.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = true,
                                    std::optional<double> scale = std::nullopt, const Tensor& positions = Tensor());
// Zeroes elements with probability p and scales the rest by 1/(1-p), drawing from the device's generator.
Tensor dropout(const Tensor& a, double p, bool training = true);

}  // namespace ingot
