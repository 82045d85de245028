// Every pass's header, for code that runs several (compile/pipeline.cpp, the pass tests). Each pass states what
// holds afterwards in its own header, compile/passes/NAME.h; what they share is compile/passes/pass.h.
#pragma once

#include "compile/passes/accumulate_index_add.h"
#include "compile/passes/accumulate_products.h"
#include "compile/passes/bucket_updates.h"
#include "compile/passes/bucket_views.h"
#include "compile/passes/cast_pieces.h"
#include "compile/passes/cse.h"
#include "compile/passes/dce.h"
#include "compile/passes/decompose_norm_bwd.h"
#include "compile/passes/functionalize.h"
#include "compile/passes/fuse.h"
#include "compile/passes/fuse_cross_entropy.h"
#include "compile/passes/matmul_epilogue.h"
#include "compile/passes/memory_plan.h"
#include "compile/passes/pack_attention_grads.h"
#include "compile/passes/pieces_into_update.h"
#include "compile/passes/remat.h"
#include "compile/passes/scale_into_products.h"
#include "compile/passes/schedule.h"
#include "compile/passes/simplify.h"
#include "compile/passes/split_update.h"
