// Package onnxpb is ONNX's protobuf schema (onnx.proto of ONNX 1.12,
// Apache-2.0, as Debian's python3-onnx ships it) compiled by protoc-gen-go.
// `make onnx-proto` remakes onnx.pb.go; nothing here is written by hand.
package onnxpb
