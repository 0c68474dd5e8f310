"""ONNX export of opbridge::ms_deform_attn (multi-scale deformable attention).

custom lowering: one ``ai.opbridge::MultiScaleDeformableAttention`` node (since domain version
2), run by opbridge's ORT library; its schema, shape inference and both exporters' rules come from
the op's declaration (cpp/ops/ms_deform_attn/ms_deform_attn_decl.cpp):
  inputs  value (N, S, M, D) T, spatial_shapes (L, 2) int64, level_start_index (L,) int64,
          sampling_locations (N, Lq, M, L, P, 2) T, attention_weights (N, Lq, M, L, P) T
  output  (N, Lq, M * D) T;  T: float32, float64, float16 or bfloat16.
spatial_shapes and level_start_index may be computed inside the graph (dynamic image sizes): the
node reads them at run time. The TorchScript exporter may type the locations (or weights) as
float64 where the model computes them in float32 (its type promotion of ``offsets /
spatial_shapes``); the declared symbolic casts inputs of one type variable to the type of its
first one, so the node stays valid.
"""
