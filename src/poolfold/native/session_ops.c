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

static OrtStatus *compute_v2(void *kernel, OrtKernelContext *context)
{
    if (callback == NULL || callback(((NodeOp *)kernel)->node, context) != 0)
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
