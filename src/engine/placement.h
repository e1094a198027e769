/* placement.h — a model spread over several devices of one host (`--gpus N`):
 * which device holds each layer's static weights and causal state (a pipeline
 * split, contiguous in layer order, balanced by bytes), which devices hold each
 * routed expert (expert parallelism: every device a share of every MoE layer's
 * experts, optionally the hottest on every device), and the per-device ledger.
 * Pure arithmetic over byte counts: nothing is allocated on a device here, so
 * a placement that does not fit is refused before anything is (ms_placement_check).
 *
 * Devices are the indices 0..n_dev-1 of the device list (`--gpus 0,1` or
 * `--gpus 0,0`: the list may name one physical device twice; the placement does
 * not know). Stage order is device order: the embedding is on device 0, the
 * final norm and the head on the last device. */
#ifndef MS_PLACEMENT_H
#define MS_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "model/model.h"
#include "util/err.h"

#define MS_MAX_DEVICES 16

typedef enum {
    MS_EXPERTS_SHARDED = 0, /* each device holds a share of every MoE layer's experts (expert parallelism) */
    MS_EXPERTS_WITH_LAYER = 1, /* a layer's experts live on the layer's device (pure pipeline) */
} ms_expert_split;

/* What is placed, in bytes. Arrays are [n_layers] unless said otherwise. */
typedef struct ms_place_input {
    int n_layers;
    int n_experts;                  /* routed experts per MoE layer (0: a dense model) */
    const uint64_t *layer_static;   /* a layer's static weights: attention, norms, router, shared experts, dense FFN */
    const uint64_t *layer_state;    /* a layer's causal state (all slots); NULL: none */
    const uint64_t *expert_bytes;   /* one routed expert of the layer (0: the layer has none); NULL: none */
    uint64_t embed_bytes;           /* on the first stage (device 0) */
    uint64_t state0_bytes;          /* causal state of no one layer (module caches): on device 0 */
    uint64_t head_bytes;            /* final norm + lm_head: on the last device */
    int head_tied;                  /* lm_head is the embedding: counted once when both are on one device */
    uint64_t workspace_bytes;       /* activations and scratch: every device holds its own */
    uint64_t overhead_bytes;        /* a fixed allowance per device (runtime, allocator) */
    ms_expert_split split;
    int replicate_hot;              /* SHARDED: the hottest this many experts of each layer on every device */
    const double *heat;             /* [n_layers * n_experts] activation counts (NULL: expert id order breaks ties,
                                     * lower ids hotter) */
} ms_place_input;

typedef struct ms_dev_ledger {
    uint64_t static_bytes;  /* layers' static weights, embedding, head */
    uint64_t expert_bytes;  /* routed experts held (home + replicas) */
    uint64_t state_bytes;   /* causal state of its layers */
    uint64_t workspace_bytes, overhead_bytes;
    uint64_t total;
    uint64_t budget;        /* what the device may hold (0: unknown, never refused) */
    int layer_begin, layer_end; /* its stage: layers [begin, end) (begin == end: no layers) */
    int n_experts_home;     /* (layer, expert) pairs whose home it is */
    int n_replicas;         /* pairs it holds as a replica */
} ms_dev_ledger;

typedef struct ms_placement {
    int n_dev, n_layers, n_experts;
    int *layer_dev;         /* [n_layers] the device of layer l (static weights, causal state, its compute) */
    int *expert_home;       /* [n_layers * n_experts] the device that computes expert e of layer l (-1: no experts) */
    uint32_t *expert_devs;  /* [n_layers * n_experts] bit d: device d holds a copy of it (home and replicas) */
    ms_dev_ledger dev[MS_MAX_DEVICES];
    uint64_t total;         /* the sum over devices */
} ms_placement;

/* Place in over n_dev (1..MS_MAX_DEVICES) devices with budgets[n_dev] (NULL or 0 entries:
 * unknown). The layers are split into n_dev contiguous stages minimizing the largest
 * device's total / budget (total bytes when no budget is known); with SHARDED experts,
 * expert e of layer l has home (e + l * n_experts) mod n_dev (each device the same number
 * of pairs, plus or minus one) and the replicate_hot hottest ones of each layer a copy on
 * every device. Errors: MS_ERR_ARG (n_dev out of range, no layers, replicate_hot > n_experts),
 * MS_ERR_NOMEM. Free with ms_placement_free. */
int ms_placement_make(const ms_place_input *in, int n_dev, const uint64_t *budgets, ms_placement *p, ms_err *err);
void ms_placement_free(ms_placement *p);
/* MS_OK when every device's total fits its budget; else MS_ERR_NOMEM naming the first device
 * that does not, by how much, and (when the sum of the budgets is short too) the shortfall of
 * the sum, with the ledger. names[d] (NULL: "device d") labels the devices. */
int ms_placement_check(const ms_placement *p, const char *const *names, ms_err *err);
/* The per-device ledger as text lines (one per device), and as a JSON array. */
void ms_placement_format(const ms_placement *p, const char *const *names, char *buf, size_t cap);
void ms_placement_json(const ms_placement *p, char *buf, size_t cap);

/* The input of model m: its layers' bytes as placed (ms_model_place_bytes), the causal state
 * per layer for `context` tokens and `slots` slots and the workspace as the memory plan counts
 * them on backend be (its own workspace included; NULL: a CPU backend of one thread) (engine/plan.h). The arrays are allocated into *in (ms_place_input_free). */
int ms_place_input_of(const ms_model *m, ms_backend *be, int context, int max_batch, int slots,
                      ms_expert_split split, int replicate_hot, ms_place_input *in, ms_err *err);
void ms_place_input_free(ms_place_input *in);

/* The engine's stages (engine.h ms_stages) of placement p over backends bes[p->n_dev] and
 * comm: stage d runs device d's layers; expert_parallel 1 runs each routed expert on its
 * home device (or on the layer's device where that holds a replica), 0 on the layer's device
 * (a placement made with MS_EXPERTS_WITH_LAYER, or sharded bytes ignored). begin, end
 * [p->n_dev]: the caller's arrays the stages point into (as p's arrays: keep them alive). */
void ms_stages_of(const ms_placement *p, ms_backend *const *bes, struct ms_comm *comm, int expert_parallel,
                  int *begin, int *end, ms_stages *out);

/* Parse a device list: "N" (devices 0..N-1) or "a,b,..." (ids, repeats allowed: "0,0" two
 * stages on one device). Into ids[cap]; returns the count, or MS_ERR_ARG naming the problem. */
int ms_parse_device_list(const char *s, int *ids, int cap, ms_err *err);

#endif
