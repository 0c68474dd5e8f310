// Host stand-in for the part of cooperative_groups the kernels use: thread-block clusters and
// distributed shared memory (tests only; see simt.h). The blocks of a cluster run together, each
// with its own shared memory; cluster.sync() waits for every thread of every block.
#pragma once
#include "simt.h"

namespace cooperative_groups {

struct cluster_group {
  void sync() const { simt::cluster_sync(); }
  unsigned block_rank() const { return simt::current().block->rank; }
  unsigned num_blocks() const { return static_cast<unsigned>(simt::current().block->cluster->blocks.size()); }
  // The address of `p` (in the calling block's shared memory) in block `rank`'s shared memory.
  template <class T>
  T* map_shared_rank(T* p, unsigned rank) const {
    simt::Block& b = *simt::current().block;
    if (rank >= b.cluster->blocks.size()) simt::fail("map_shared_rank: rank outside the cluster");
    return static_cast<T*>(b.cluster->blocks[rank]->map_from(b, p));
  }
};

inline cluster_group this_cluster() { return {}; }

}  // namespace cooperative_groups
