// Vocabulary-parallel embeddings for FullyShardedDataParallel (Note [Vocabulary-parallel embeddings],
// distributed/fsdp.h): the embeddings unit's table looked up where its rows lie instead of gathered.
// Internal to distributed/.
#pragma once

#include <memory>

#include "distributed/fsdp.h"

namespace ingot::nn {
class Embedding;
}

namespace ingot::distributed::fsdp_vocab {

// Makes the embeddings unit vocabulary-parallel when it qualifies: one [vocab, dim] table of one nn::Embedding
// (`module`), not read by the head (untied), vocab divisible by the world size (each rank's shard is whole rows),
// a world of two or more, and FsdpOptions::vocab_parallel_embeddings. Replaces the module's lookup.
void enable_if_eligible(const std::weak_ptr<FullyShardedDataParallel::State>& state, nn::Embedding* module);
// Puts the module's own lookup back (unshard()).
void disable(FullyShardedDataParallel::State& s);

}  // namespace ingot::distributed::fsdp_vocab
