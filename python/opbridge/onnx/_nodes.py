"""The nodes of an ONNX model, those of its subgraphs (If, Loop and Scan bodies) included: what
every whole-model check must see, since a custom node can sit in a branch."""

from __future__ import annotations

from typing import Iterator

import onnx

__all__ = ["graph_nodes", "graphs", "model_nodes"]


def _subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def graph_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of ``graph`` and, depth first, of the subgraphs its nodes' attributes hold."""
    for node in graph.node:
        yield node
        for g in _subgraphs(node):
            yield from graph_nodes(g)


def graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and, depth first, every subgraph within it."""
    yield graph
    for node in graph.node:
        for g in _subgraphs(node):
            yield from graphs(g)


def model_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Every node of the model: its graph's, their subgraphs', its functions'."""
    return list(graph_nodes(model.graph)) + [n for f in model.functions for n in f.node]
