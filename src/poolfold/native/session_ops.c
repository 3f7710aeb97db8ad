/* poolfold's nodes as custom ops of an onnxruntime session, computed by a callback into
 * Python (poolfold.session_ops).
 *
 * onnxruntime loads this library by path (SessionOptions.register_custom_ops_library) and
 * calls RegisterCustomOps, which adds the ops declared since the last pf_begin: one op per
 * node, with the node's exact input and output types, in a domain of its own.  Each op's
 * kernel hands its node number and onnxruntime's kernel context to the callback, which reads
 * the inputs through pf_inputs and asks for each output through pf_output.
 *
 * Only onnxruntime's C ABI is used, declared here from its documented layout: the OrtApi
 * table is read by slot (each slot has kept its place since the API's first version; the
 * slots used here are all of version 1), and OrtCustomOp is filled up to its version 16
 * members, the version whose compute function returns a status. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct OrtStatus OrtStatus;
typedef struct OrtValue OrtValue;
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef void *const *OrtApiTable; /* struct OrtApi: function pointers, read by slot */

typedef struct OrtApiBase {
    OrtApiTable (*GetApi)(uint32_t version);
    const char *(*GetVersionString)(void);
} OrtApiBase;

/* The OrtApi slots used (zero-based, in the header's declaration order). */
enum {
    SLOT_CREATE_STATUS = 0,
    SLOT_CREATE_CUSTOM_OP_DOMAIN = 26,
    SLOT_CUSTOM_OP_DOMAIN_ADD = 27,
    SLOT_ADD_CUSTOM_OP_DOMAIN = 28,
    SLOT_GET_TENSOR_MUTABLE_DATA = 51,
    SLOT_GET_TENSOR_ELEMENT_TYPE = 60,
    SLOT_GET_DIMENSIONS_COUNT = 61,
    SLOT_GET_DIMENSIONS = 62,
    SLOT_GET_TENSOR_TYPE_AND_SHAPE = 65,
    SLOT_KERNEL_CONTEXT_GET_INPUT = 90,
    SLOT_KERNEL_CONTEXT_GET_OUTPUT = 91,
    SLOT_RELEASE_STATUS = 93,
    SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO = 99,
    SLOT_KERNEL_CONTEXT_PARALLEL_FOR = 274, /* from version 17 (onnxruntime 1.17) */
};

#define API_VERSION 16 /* onnxruntime 1.16: KernelComputeV2 */
#define ORT_RUNTIME_EXCEPTION 6
#define MAX_TYPES 8

typedef struct OrtCustomOp {
    uint32_t version;
    void *(*CreateKernel)(const struct OrtCustomOp *, OrtApiTable, const OrtKernelInfo *);
    const char *(*GetName)(const struct OrtCustomOp *);
    const char *(*GetExecutionProviderType)(const struct OrtCustomOp *);
    int (*GetInputType)(const struct OrtCustomOp *, size_t);
    size_t (*GetInputTypeCount)(const struct OrtCustomOp *);
    int (*GetOutputType)(const struct OrtCustomOp *, size_t);
    size_t (*GetOutputTypeCount)(const struct OrtCustomOp *);
    void (*KernelCompute)(void *, OrtKernelContext *);
    void (*KernelDestroy)(void *);
    int (*GetInputCharacteristic)(const struct OrtCustomOp *, size_t);
    int (*GetOutputCharacteristic)(const struct OrtCustomOp *, size_t);
    int (*GetInputMemoryType)(const struct OrtCustomOp *, size_t);
    int (*GetVariadicInputMinArity)(const struct OrtCustomOp *);
    int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp *);
    int (*GetVariadicOutputMinArity)(const struct OrtCustomOp *);
    int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp *);
    OrtStatus *(*CreateKernelV2)(const struct OrtCustomOp *, OrtApiTable, const OrtKernelInfo *,
                                 void **);
    OrtStatus *(*KernelComputeV2)(void *, OrtKernelContext *);
} OrtCustomOp;

/* One node's op.  `base` comes first: onnxruntime hands back the OrtCustomOp pointer. */
typedef struct NodeOp {
    OrtCustomOp base;
    int64_t node;
    char name[32];
    size_t inputs, outputs;
    int input_types[MAX_TYPES], output_types[MAX_TYPES];
    struct NodeOp *next;
} NodeOp;

typedef int (*Callback)(int64_t node, OrtKernelContext *context);

static OrtApiTable api;
static OrtApiTable api17; /* NULL before onnxruntime 1.17: no parallel-for */
static Callback callback;
static char domain_name[64];
static NodeOp *declared; /* the ops the next RegisterCustomOps adds, last declared first */

#define CALL(slot, type) ((type)api[slot])
#define EXPORT __attribute__((visibility("default")))

static const char *op_name(const OrtCustomOp *op) { return ((const NodeOp *)op)->name; }
static const char *cpu_provider(const OrtCustomOp *op) { (void)op; return NULL; }
static int input_type(const OrtCustomOp *op, size_t i)
{
    return ((const NodeOp *)op)->input_types[i];
}
static size_t input_count(const OrtCustomOp *op) { return ((const NodeOp *)op)->inputs; }
static int output_type(const OrtCustomOp *op, size_t i)
{
    return ((const NodeOp *)op)->output_types[i];
}
static size_t output_count(const OrtCustomOp *op) { return ((const NodeOp *)op)->outputs; }
static int required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int default_memory(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return 0; }
static int one(const OrtCustomOp *op) { (void)op; return 1; }

static void *create_kernel(const OrtCustomOp *op, OrtApiTable given, const OrtKernelInfo *info)
{
    (void)given; (void)info;
    return (void *)op; /* the kernel is its op: all it needs is the node number */
}

static OrtStatus *create_kernel_v2(const OrtCustomOp *op, OrtApiTable given,
                                   const OrtKernelInfo *info, void **kernel)
{
    *kernel = create_kernel(op, given, info);
    return NULL;
}

static int replayed(int64_t node, OrtKernelContext *context);

static OrtStatus *compute_v2(void *kernel, OrtKernelContext *context)
{
    int64_t node = ((NodeOp *)kernel)->node;
    if (replayed(node, context))
        return NULL;
    if (callback == NULL || callback(node, context) != 0)
        return CALL(SLOT_CREATE_STATUS, OrtStatus *(*)(int, const char *))(
            ORT_RUNTIME_EXCEPTION, "poolfold: the node's kernel raised an error");
    return NULL;
}

static void compute(void *kernel, OrtKernelContext *context)
{
    OrtStatus *status = compute_v2(kernel, context);
    if (status != NULL)
        CALL(SLOT_RELEASE_STATUS, void (*)(OrtStatus *))(status);
}

static void destroy_kernel(void *kernel) { (void)kernel; }

EXPORT void pf_set_callback(Callback given) { callback = given; }

/* Starts the declarations for the next registration; its ops go in `domain`. */
EXPORT void pf_begin(const char *domain)
{
    strncpy(domain_name, domain, sizeof domain_name - 1);
    declared = NULL;
}

/* Declares one node's op; 0 on success. */
EXPORT int pf_declare(const char *name, int64_t node, size_t inputs, const int *input_types,
               size_t outputs, const int *output_types)
{
    if (inputs > MAX_TYPES || outputs > MAX_TYPES || strlen(name) >= 32)
        return 1;
    NodeOp *op = calloc(1, sizeof *op);
    if (op == NULL)
        return 1;
    op->base.version = API_VERSION;
    op->base.CreateKernel = create_kernel;
    op->base.GetName = op_name;
    op->base.GetExecutionProviderType = cpu_provider;
    op->base.GetInputType = input_type;
    op->base.GetInputTypeCount = input_count;
    op->base.GetOutputType = output_type;
    op->base.GetOutputTypeCount = output_count;
    op->base.KernelCompute = compute;
    op->base.KernelDestroy = destroy_kernel;
    op->base.GetInputCharacteristic = required;
    op->base.GetOutputCharacteristic = required;
    op->base.GetInputMemoryType = default_memory;
    op->base.GetVariadicInputMinArity = one;
    op->base.GetVariadicInputHomogeneity = one;
    op->base.GetVariadicOutputMinArity = one;
    op->base.GetVariadicOutputHomogeneity = one;
    op->base.CreateKernelV2 = create_kernel_v2;
    op->base.KernelComputeV2 = compute_v2;
    op->node = node;
    strcpy(op->name, name);
    op->inputs = inputs;
    op->outputs = outputs;
    memcpy(op->input_types, input_types, inputs * sizeof(int));
    memcpy(op->output_types, output_types, outputs * sizeof(int));
    op->next = declared;
    declared = op;
    return 0;
}

/* onnxruntime's entry point.  The ops and their domain live as long as the process: a
 * session keeps pointers to them, and nothing says when the last such session is gone. */
EXPORT OrtStatus *RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base)
{
    OrtApiTable given = base->GetApi(API_VERSION);
    if (given == NULL)
        return NULL; /* an onnxruntime older than 1.16: no ops, so the session is refused */
    api = given;
    api17 = base->GetApi(17);
    OrtCustomOpDomain *domain = NULL;
    OrtStatus *status = CALL(SLOT_CREATE_CUSTOM_OP_DOMAIN,
                             OrtStatus *(*)(const char *, OrtCustomOpDomain **))(
        domain_name, &domain);
    for (NodeOp *op = declared; status == NULL && op != NULL; op = op->next)
        status = CALL(SLOT_CUSTOM_OP_DOMAIN_ADD,
                      OrtStatus *(*)(OrtCustomOpDomain *, const OrtCustomOp *))(domain,
                                                                                &op->base);
    if (status == NULL)
        status = CALL(SLOT_ADD_CUSTOM_OP_DOMAIN,
                      OrtStatus *(*)(OrtSessionOptions *, OrtCustomOpDomain *))(options,
                                                                                domain);
    declared = NULL;
    return status;
}

/* Input `index` of a kernel's call: its data, element type and shape (up to `max_rank`
 * dims); 0 on success. */
static int pf_input(OrtKernelContext *context, size_t index, void **data, int *type,
                    int64_t *dims, size_t max_rank, size_t *rank)
{
    const OrtValue *value = NULL;
    OrtTensorTypeAndShapeInfo *info = NULL;
    int failed = 0;
    OrtStatus *status = CALL(SLOT_KERNEL_CONTEXT_GET_INPUT,
                             OrtStatus *(*)(const OrtKernelContext *, size_t,
                                            const OrtValue **))(context, index, &value);
    if (status == NULL)
        status = CALL(SLOT_GET_TENSOR_TYPE_AND_SHAPE,
                      OrtStatus *(*)(const OrtValue *, OrtTensorTypeAndShapeInfo **))(value,
                                                                                      &info);
    if (status == NULL)
        status = CALL(SLOT_GET_TENSOR_ELEMENT_TYPE,
                      OrtStatus *(*)(const OrtTensorTypeAndShapeInfo *, int *))(info, type);
    if (status == NULL)
        status = CALL(SLOT_GET_DIMENSIONS_COUNT,
                      OrtStatus *(*)(const OrtTensorTypeAndShapeInfo *, size_t *))(info, rank);
    if (status == NULL && *rank > max_rank)
        failed = 1;
    if (status == NULL && !failed)
        status = CALL(SLOT_GET_DIMENSIONS,
                      OrtStatus *(*)(const OrtTensorTypeAndShapeInfo *, int64_t *, size_t))(
            info, dims, *rank);
    if (status == NULL && !failed)
        status = CALL(SLOT_GET_TENSOR_MUTABLE_DATA, OrtStatus *(*)(OrtValue *, void **))(
            (OrtValue *)value, data);
    if (info != NULL)
        CALL(SLOT_RELEASE_TENSOR_TYPE_AND_SHAPE_INFO,
             void (*)(OrtTensorTypeAndShapeInfo *))(info);
    if (status != NULL) {
        CALL(SLOT_RELEASE_STATUS, void (*)(OrtStatus *))(status);
        return 1;
    }
    return failed;
}

/* Every input of a kernel's call, `count` of them, into `facts`: `stride` int64 a row, each
 * its data address, element type, rank and dims (up to stride - 3); 0 on success. */
EXPORT int pf_inputs(OrtKernelContext *context, size_t count, int64_t *facts, size_t stride)
{
    for (size_t i = 0; i < count; i++) {
        int64_t *row = facts + i * stride;
        void *data = NULL;
        int type = 0;
        size_t rank = 0;
        if (pf_input(context, i, &data, &type, row + 3, stride - 3, &rank) != 0)
            return 1;
        row[0] = (int64_t)(intptr_t)data;
        row[1] = type;
        row[2] = (int64_t)rank;
    }
    return 0;
}

/* Output `index` of a kernel's call, allocated by onnxruntime in the shape given: its data,
 * or NULL on failure (a tensor of no elements may also have none). */
EXPORT int pf_output(OrtKernelContext *context, size_t index, const int64_t *dims, size_t rank,
              void **data)
{
    OrtValue *value = NULL;
    *data = NULL;
    OrtStatus *status = CALL(SLOT_KERNEL_CONTEXT_GET_OUTPUT,
                             OrtStatus *(*)(OrtKernelContext *, size_t, const int64_t *, size_t,
                                            OrtValue **))(context, index, dims, rank, &value);
    if (status == NULL)
        status = CALL(SLOT_GET_TENSOR_MUTABLE_DATA, OrtStatus *(*)(OrtValue *, void **))(value,
                                                                                   data);
    if (status != NULL) {
        CALL(SLOT_RELEASE_STATUS, void (*)(OrtStatus *))(status);
        return 1;
    }
    return 0;
}

/* A kernel's pieces (poolfold.kernels.native_split): each call of `entry` on `frame` claims
 * pieces until none is left. */
typedef struct Job {
    void (*entry)(void *);
    void *frame;
} Job;

static void run_job(void *job, size_t index)
{
    (void)index;
    ((Job *)job)->entry(((Job *)job)->frame);
}

/* Runs `entry(frame)` on `threads` of onnxruntime's intra-op threads (the calling one among
 * them) through the kernel context's parallel-for, and returns when all are done; where
 * there is none (onnxruntime before 1.17, or its call failed), on the calling thread. */
EXPORT void pf_parallel(OrtKernelContext *context, int64_t entry, int64_t frame,
                        int64_t threads)
{
    Job job = {(void (*)(void *))(intptr_t)entry, (void *)(intptr_t)frame};
    OrtStatus *status = NULL;
    if (api17 != NULL)
        status = ((OrtStatus * (*)(const OrtKernelContext *, void (*)(void *, size_t), size_t,
                                   size_t, void *))api17[SLOT_KERNEL_CONTEXT_PARALLEL_FOR])(
            context, run_job, (size_t)threads, (size_t)0, (void *)&job);
    if (api17 == NULL || status != NULL) {
        if (status != NULL)
            CALL(SLOT_RELEASE_STATUS, void (*)(OrtStatus *))(status);
        run_job(&job, 0);
    }
}

/* ---------------------------------------------------------------------- replays
 *
 * A node whose call is its outputs' allocation and one launch of a kernel's pieces (a
 * MaxPool's: see poolfold.session_ops) is armed by Python with that launch, kept: the
 * inputs' facts it was made on, the outputs' shapes and the buffers onnxruntime gave them,
 * and a frame that claims and runs the pieces (poolfold.kernels.native_split.keep_hosted).
 * Its next call, handed the same buffers, runs that frame here, with no Python at all;
 * anything else calls back.  Python runs cold after onnxruntime's kernels: a callback cost
 * googlenet's MaxPools about 40 us each around their kernels. */

#define MAX_RANK 61 /* as poolfold.session_ops._MAX_RANK */
#define FACTS (3 + MAX_RANK) /* a row of pf_inputs' facts */

typedef struct Replay {
    size_t inputs, outputs;
    int64_t input_facts[MAX_TYPES][FACTS];
    int64_t places[MAX_TYPES], ranks[MAX_TYPES], dims[MAX_TYPES][MAX_RANK];
    int64_t data[MAX_TYPES];
    int64_t *flags; /* the frame's; its claims and error zeroed before each run */
    int64_t claims, error, entry, frame, threads;
    int threads_set; /* POOLFOLD_NUM_THREADS when armed: a call under another calls back */
    char threads_variable[32];
} Replay;

#define THREADS_VARIABLE "POOLFOLD_NUM_THREADS"

static int same_threads(const Replay *r)
{
    const char *now = getenv(THREADS_VARIABLE);
    if (now == NULL)
        return !r->threads_set;
    return r->threads_set && strncmp(now, r->threads_variable, sizeof r->threads_variable) == 0;
}

typedef struct Slot {
    int busy; /* held by a run or by an arming, never waited for by a run */
    Replay *replay;
} Slot;

#define SLOT_BITS 10
#define CHUNKS 4096 /* node numbers below 2^22 */
static Slot *chunks[CHUNKS];

static Slot *slot_of(int64_t node, int create)
{
    if (node < 0 || (node >> SLOT_BITS) >= CHUNKS)
        return NULL;
    Slot **at = &chunks[node >> SLOT_BITS];
    Slot *chunk = __atomic_load_n(at, __ATOMIC_ACQUIRE);
    if (chunk == NULL && create) {
        Slot *fresh = calloc((size_t)1 << SLOT_BITS, sizeof(Slot));
        if (fresh == NULL)
            return NULL;
        chunk = NULL;
        if (__atomic_compare_exchange_n(at, &chunk, fresh, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            chunk = fresh;
        else
            free(fresh); /* another thread's chunk, now in chunk */
    }
    return chunk == NULL ? NULL : &chunk[node & (((int64_t)1 << SLOT_BITS) - 1)];
}

static int take(Slot *slot) { return __atomic_exchange_n(&slot->busy, 1, __ATOMIC_ACQUIRE) == 0; }
static void give(Slot *slot) { __atomic_store_n(&slot->busy, 0, __ATOMIC_RELEASE); }

/* Whether the node's kept launch ran for this call: its inputs and outputs in the buffers
 * it was made on, and no piece flagged an error.  Outputs asked for before it gave up are
 * asked for again by the callback (onnxruntime hands the same tensor). */
static int replayed(int64_t node, OrtKernelContext *context)
{
    Slot *slot = slot_of(node, 0);
    if (slot == NULL || __atomic_load_n(&slot->replay, __ATOMIC_RELAXED) == NULL ||
        !take(slot))
        return 0; /* none, or in use by another run (which is handed other buffers) */
    Replay *r = slot->replay;
    int done = 0;
    int64_t facts[FACTS];
    if (r == NULL || !same_threads(r))
        goto out; /* disarmed since the check above, or another thread count */
    for (size_t i = 0; i < r->inputs; i++) {
        void *data = NULL;
        int type = 0;
        size_t rank = 0;
        if (pf_input(context, i, &data, &type, facts + 3, MAX_RANK, &rank) != 0 ||
            (int64_t)(intptr_t)data != r->input_facts[i][0] || type != r->input_facts[i][1] ||
            (int64_t)rank != r->input_facts[i][2] ||
            memcmp(facts + 3, r->input_facts[i] + 3, rank * sizeof(int64_t)) != 0)
            goto out;
    }
    for (size_t j = 0; j < r->outputs; j++) {
        void *data = NULL;
        if (pf_output(context, (size_t)r->places[j], r->dims[j], (size_t)r->ranks[j], &data) !=
                0 ||
            (int64_t)(intptr_t)data != r->data[j])
            goto out;
    }
    __atomic_store_n(&r->flags[r->claims], 0, __ATOMIC_RELAXED);
    __atomic_store_n(&r->flags[r->error], 0, __ATOMIC_RELEASE);
    pf_parallel(context, r->entry, r->frame, r->threads);
    done = __atomic_load_n(&r->flags[r->error], __ATOMIC_ACQUIRE) == 0;
out:
    give(slot);
    return done;
}

/* Arms node `node` with a kept launch (see Replay; `input_facts` as pf_inputs writes them,
 * FACTS int64 a row; `dims` MAX_RANK a row), or disarms it with inputs = 0: 0 on success.
 * Waits for a run of the node in progress. */
EXPORT int pf_arm(int64_t node, size_t inputs, const int64_t *input_facts, size_t outputs,
                  const int64_t *places, const int64_t *ranks, const int64_t *dims,
                  const int64_t *data, int64_t *flags, int64_t claims, int64_t error,
                  int64_t entry, int64_t frame, int64_t threads)
{
    if (inputs > MAX_TYPES || outputs > MAX_TYPES)
        return 1;
    Slot *slot = slot_of(node, inputs > 0);
    if (slot == NULL)
        return inputs > 0;
    Replay *r = NULL;
    if (inputs > 0) {
        r = calloc(1, sizeof *r);
        if (r == NULL)
            return 1;
        r->inputs = inputs;
        r->outputs = outputs;
        memcpy(r->input_facts, input_facts, inputs * FACTS * sizeof(int64_t));
        for (size_t j = 0; j < outputs; j++) {
            if (ranks[j] < 0 || ranks[j] > MAX_RANK) {
                free(r);
                return 1;
            }
            r->places[j] = places[j];
            r->ranks[j] = ranks[j];
            memcpy(r->dims[j], dims + j * MAX_RANK, (size_t)ranks[j] * sizeof(int64_t));
            r->data[j] = data[j];
        }
        r->flags = flags;
        r->claims = claims;
        r->error = error;
        r->entry = entry;
        r->frame = frame;
        r->threads = threads;
        const char *variable = getenv(THREADS_VARIABLE);
        if (variable != NULL && strlen(variable) >= sizeof r->threads_variable) {
            free(r); /* a value this long is not a count: the callback warns of it */
            return 1;
        }
        r->threads_set = variable != NULL;
        if (variable != NULL)
            strcpy(r->threads_variable, variable);
    }
    while (!take(slot))
        ; /* a run of this node holds it for one kernel's time */
    Replay *old = slot->replay;
    __atomic_store_n(&slot->replay, r, __ATOMIC_RELEASE);
    give(slot);
    free(old);
    return 0;
}
