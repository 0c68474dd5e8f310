"""Quick side-by-side timing of opbridge vs torch and ONNX Runtime built-ins (2 threads, fp32,
medians of plain calls; ORT through InferenceSession.run, so its Python overhead is included;
MultiScaleDeformableAttention through IOBinding).
GroupNorm is also shown against the memory floor, a same-size copy (x.clone()) timed in the same
process: "1.05x copy" means 5% slower than copying the tensor, in both memory formats and with
the fused SiLU. The asv suite in this folder is the reference; this is a one-minute sanity check:

    MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=4294967296 python benchmarks/quick_compare.py
"""
import time, torch, numpy as np, opbridge, onnxruntime as ort
from onnx import helper, TensorProto
torch.set_num_threads(2)
def bench(fn, n=60):
    for _ in range(3): fn()
    ts=[]
    for _ in range(n):
        t=time.perf_counter(); fn(); ts.append(time.perf_counter()-t)
    return np.median(ts)*1e6
def sess(nodes, inputs, opset, ir):
    g=helper.make_graph(nodes,"g",[helper.make_tensor_value_info(n,TensorProto.FLOAT,None) for n in inputs],[helper.make_tensor_value_info("Y",TensorProto.FLOAT,None)])
    m=helper.make_model(g,opset_imports=[helper.make_opsetid("",opset),helper.make_opsetid("ai.opbridge",1),helper.make_opsetid("com.microsoft",1)],ir_version=ir)
    so=ort.SessionOptions(); so.intra_op_num_threads=2
    return opbridge.InferenceSession(m.SerializeToString(), so)
for shape in [(1,64,56,56),(8,256,32,32),(2,512,64,64)]:
    x=torch.randn(*shape); w=torch.randn(shape[1]); b=torch.randn(shape[1])
    feed={"X":x.numpy(),"s":w.numpy(),"b":b.numpy()}
    s_ob=sess([helper.make_node("GroupNorm",["X","s","b"],["Y"],domain="ai.opbridge",num_groups=32)],["X","s","b"],17,9)
    s_21=sess([helper.make_node("GroupNormalization",["X","s","b"],["Y"],num_groups=32)],["X","s","b"],21,10)
    t_t=bench(lambda: torch.nn.functional.group_norm(x,32,w,b))
    t_o=bench(lambda: opbridge.ops.group_norm(x,32,w,b))
    t_r=bench(lambda: s_ob.run(None,feed))
    t_21=bench(lambda: s_21.run(None,feed), 20)
    print(shape, f"torch {t_t:.0f}  ob-torch {t_o:.0f} ({t_t/t_o:.2f}x)  ob-ort {t_r:.0f} ({t_t/t_r:.2f}x vs torch, {t_21/t_r:.1f}x vs GN-21 {t_21:.0f})")
def ratios(fns, rounds=15):
    """Median over interleaved rounds of time(f) / time(fns[0]) for each f: ratios to the first."""
    for f in fns.values():
        for _ in range(3): f()
    per = {k: [] for k in fns}
    for _ in range(rounds):
        t = {}
        for k, f in fns.items():
            t0 = time.perf_counter(); f(); f(); t[k] = (time.perf_counter() - t0) / 2
        base = t[next(iter(fns))]
        for k in fns: per[k].append(t[k] / base)
    return {k: float(np.median(v)) for k, v in per.items()}
F = torch.nn.functional
for shape in [(8,256,32,32),(2,512,64,64),(2,128,64,64),(1,512,64,64)]:
    for fmt in ("contiguous", "channels_last"):
        for act in ("none", "silu"):
            x=torch.randn(*shape); w=torch.randn(shape[1]); b=torch.randn(shape[1])
            if fmt == "channels_last": x = x.contiguous(memory_format=torch.channels_last)
            native = (lambda: F.silu(F.group_norm(x,32,w,b))) if act == "silu" else (lambda: F.group_norm(x,32,w,b))
            r = ratios({"copy": lambda: x.clone(), "ob": lambda: opbridge.ops.group_norm(x,32,w,b,1e-5,act), "torch": native})
            print(shape, fmt, act, f"copy {bench(lambda: x.clone()):.0f} us  opbridge {r['ob']:.2f}x copy  torch {r['torch']:.2f}x copy")
for shape in [(4096,3,3),(1024,8,8),(64,64,64),(8,256,256)]:
    a=torch.randn(*shape)+torch.eye(shape[-1])*shape[-1]
    s_ob=sess([helper.make_node("Inverse",["X"],["Y"],domain="ai.opbridge")],["X"],17,9)
    s_ms=sess([helper.make_node("Inverse",["X"],["Y"],domain="com.microsoft")],["X"],17,9)
    feed={"X":a.numpy()}
    t_o=bench(lambda: opbridge.ops.inverse(a)); t_r=bench(lambda: s_ob.run(None,feed)); t_m=bench(lambda: s_ms.run(None,feed))
    t_t=bench(lambda: torch.linalg.inv(a)) if shape[-1] < 150 else float('nan')
    print(shape, f"torch.linalg.inv {t_t:.0f}  ob-torch {t_o:.0f} ({t_t/t_o:.2f}x)  ob-ort {t_r:.0f}  com.microsoft {t_m:.0f} ({t_m/t_r:.2f}x)")
# MultiScaleDeformableAttention (benchmarks/benchmarks/bench_ms_deform_attn.py): one Deformable-DETR
# encoder call (Lq = S = 5440) and one decoder call (Lq = 300), model-like and uniform locations;
# baselines: the pure-PyTorch function in torch and its plain dynamo export in stock ORT (IOBinding).
import os, sys, platform, subprocess
os.environ.setdefault("OPBRIDGE_BENCH_THREADS", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmarks import bench_ms_deform_attn as msda
cpu = next((l.split(":", 1)[1].strip() for l in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines() if l.startswith("Model name")), platform.processor())
print(f"MultiScaleDeformableAttention, 2 threads, float32, {cpu}; medians in ms")
for shape in ("encoder", "decoder"):
    for locs in ("model", "uniform"):
        fns = {impl: msda.make_fn(impl, shape, locs) for impl in msda.IMPLS}
        t = {impl: bench(fn, 30 if impl.startswith("opbridge") else 5) / 1e3 for impl, fn in fns.items()}
        print(f"{shape} {locs}: pure-PyTorch {t['torch-pytorch']:.1f}  ob-torch {t['opbridge-torch']:.2f} "
              f"({t['torch-pytorch']/t['opbridge-torch']:.1f}x)  ORT export {t['ort-pytorch-export']:.1f}  "
              f"ob-ort {t['opbridge-ort']:.2f} ({t['ort-pytorch-export']/t['opbridge-ort']:.1f}x)")
