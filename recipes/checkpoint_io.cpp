#include "recipes/checkpoint_io.h"

#include <filesystem>
#include <memory>
#include <ostream>
#include <system_error>

#include "recipes/checkpoint.h"
#include "recipes/data_parallel.h"

namespace ingot::recipes {

namespace fs = std::filesystem;

CheckpointIO::CheckpointIO(const RunSettings& run, TrainTask& task, DataParallel* dp, const optim::OptimizerSpec& spec,
                           bool masters, std::ostream& log)
    : run_(run), task_(task), dp_(dp), spec_(spec), log_(log), with_masters_(masters && run.dtype != DType::f32),
      is_main_(!dp || dp->rank() == 0),
      sharded_(dp && dp->sharded()) {}

void CheckpointIO::read_before_wrap() {
  if (run_.resume_checkpoint.empty()) return;
  nn::Module& model = *task_.model;
  if (dp_ && dp_->zero_stage() >= 2 && is_sharded_checkpoint(run_.resume_checkpoint)) {
    shards_ = ShardedCheckpoint::open(run_.resume_checkpoint);
    // ZeRO-2 keeps the weights whole on every rank; ZeRO-3 reads its shards of them after wrapping.
    read_state_ = load_sharded_model_state(*shards_, model, task_.params, /*load_trained=*/dp_->zero_stage() == 2);
  } else if (sharded_) {
    std::unique_ptr<optim::MasterWeights> m;
    if (with_masters_) m = std::make_unique<optim::MasterWeights>(task_.params);
    std::unique_ptr<optim::Optimizer> stand_in = optim::make_optimizer(m ? m->master() : task_.params, spec_);
    stand_in->hold_loaded_state();
    read_state_ = load_training_checkpoint(run_.resume_checkpoint, model, *stand_in, m.get());
    // Element by element, as the shards cut it (Note [8-bit state element by element], optim/adamw8bit.cpp).
    full_opt_state_ = stand_in->element_state_dict();
    if (m) full_masters_ = m->master();
  }
}

void CheckpointIO::attach(optim::Optimizer& opt, optim::MasterWeights* masters) {
  opt_ = &opt;
  masters_ = masters;
}

TrainState CheckpointIO::resume() {
  INGOT_INTERNAL_CHECK(opt_, "CheckpointIO::resume before attach");
  if (run_.resume_checkpoint.empty()) return {};
  TrainState st = read_state_;
  if (shards_) {
    // A bf16 ZeRO-3 run's shards hold no bytes (DataParallel::gather_from_masters): the masters alone are read.
    const DataParallel::EightBitLoad eight =
        dp_->load_shards(*shards_, *task_.model, *opt_, masters_ ? masters_->master() : std::vector<Tensor>{});
    if (is_main_ && eight.as_written + eight.requantized > 0)
      log_ << "checkpoint | 8-bit moments: " << eight.as_written << " bucket(s) loaded as written, "
           << eight.requantized << " decoded and requantized (another world size or layout)\n";
  } else if (sharded_) {
    // The stand-in's whole state and masters, cut into this rank's shards.
    opt_->load_state_dict(dp_->scatter_optimizer_state(full_opt_state_));
    if (masters_) {
      NoGradGuard no_grad;
      std::vector<Tensor> chunks = dp_->scatter_to_chunks(full_masters_);
      for (size_t i = 0; i < chunks.size(); ++i) {
        Tensor dst = masters_->master()[i];
        dst.copy_(chunks[i]);
      }
    }
  } else {
    st = load_training_checkpoint(run_.resume_checkpoint, *task_.model, *opt_, masters_);
  }
  full_opt_state_.clear();  // the shards hold it now
  full_masters_.clear();
  start_step_ = st.step;
  return st;
}

std::string CheckpointIO::write(const TrainState& state) {
  if (!sharded_) {
    if (!is_main_) return checkpoint_path(run_.output_dir, state.step);
    return save_training_checkpoint(run_.output_dir, *task_.model, *opt_, masters_, state);
  }
  if (dp_->zero_stage() >= 2)
    // The state as the shards hold it: AdamW8bit's codes in their blocks (Note [Moments in their blocks]).
    return dp_->save_sharded_checkpoint(run_.output_dir, state.step, *task_.model, opt_->state_dict(),
                                        masters_ ? masters_->master() : std::vector<Tensor>{},
                                        train_state_json(state));
  return write_zero1(state);
}

// Every rank takes part in the gathers; rank 0 puts the whole state into a stand-in optimizer over the whole
// parameters and writes it as a plain checkpoint.
std::string CheckpointIO::write_zero1(const TrainState& state) {
  std::map<std::string, Tensor> opt_state = dp_->gather_optimizer_state(opt_->element_state_dict());
  std::vector<Tensor> gathered_masters;
  if (masters_) gathered_masters = dp_->gather_to_params(masters_->master());
  if (!is_main_) return checkpoint_path(run_.output_dir, state.step);
  std::unique_ptr<optim::MasterWeights> m;
  if (masters_) {
    NoGradGuard no_grad;
    m = std::make_unique<optim::MasterWeights>(task_.params);
    for (size_t i = 0; i < gathered_masters.size(); ++i) {
      Tensor dst = m->master()[i];
      dst.copy_(gathered_masters[i]);
    }
  }
  std::unique_ptr<optim::Optimizer> stand_in = optim::make_optimizer(m ? m->master() : task_.params, spec_);
  stand_in->hold_loaded_state();  // AdamW8bit: the f32 moments are written as they are, exact for the shards' blocks
  stand_in->load_state_dict(opt_state);
  return save_training_checkpoint(run_.output_dir, *task_.model, *stand_in, m.get(), state);
}

std::string CheckpointIO::save(const TrainState& state) {
  INGOT_INTERNAL_CHECK(opt_, "CheckpointIO::save before attach");
  const std::string path = write(state);
  remove_stale(path);
  if (is_main_) prune_checkpoints(run_.output_dir, run_.keep_last);
  // No rank goes on (or can die) before the checkpoint is complete: a restarted job resumes from it.
  if (dp_) dp_->barrier();
  log_ << "checkpoint | step " << state.step << " | " << path << "\n" << std::flush;
  return path;
}

void CheckpointIO::remove_stale(const std::string& own) {
  if (!is_main_ || stale_removed_) return;
  stale_removed_ = true;
  std::error_code rm;
  for (const auto& [old_step, old_path] : list_checkpoints(run_.output_dir)) {
    if (old_step <= start_step_ || old_path == own) continue;
    fs::remove_all(old_path, rm);
    INGOT_CHECK(!rm, "cannot remove checkpoint '", old_path, "': ", rm.message());
    log_ << "checkpoint | removed " << old_path << " ("
         << (start_step_ > 0 ? "past the resumed step " + std::to_string(start_step_)
                             : "an earlier run's; overwrite_output_dir")
         << ")\n";
  }
}

}  // namespace ingot::recipes
