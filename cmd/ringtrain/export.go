package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/onnx"
)

// runExport is `ringtrain export --checkpoint FILE --onnx OUT`: the
// checkpoint's model as an ONNX file (opset 13), written atomically.
func runExport(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ckpt := fs.String("checkpoint", "", "checkpoint file (from a job's checkpoint_dir)")
	out := fs.String("onnx", "", "the ONNX file to write")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("export: %w: %w", errUsage, err)
	}
	if *ckpt == "" || *out == "" {
		return fmt.Errorf("export: --checkpoint and --onnx are required: %w", errUsage)
	}
	c, err := train.LoadCheckpoint(*ckpt)
	if err == nil {
		err = c.Whole()
	}
	if err != nil {
		return fmt.Errorf("export: %s: %w", *ckpt, err)
	}
	if err := onnx.Write(c, *out); err != nil {
		return fmt.Errorf("export: %s: %w", *ckpt, err)
	}
	if spec := c.Model.Spec; spec.Loss != train.CrossEntropy {
		fmt.Fprintf(stdout, "%s: ONNX opset %d, input %v features per sample, %d outputs (loss %s)\n",
			*out, onnx.Opset, spec.Input, spec.Targets(), spec.Loss)
		return nil
	}
	fmt.Fprintf(stdout, "%s: ONNX opset %d, input %v floats in [0, 1] per sample (Normalize inside), %d classes\n",
		*out, onnx.Opset, c.Input, len(c.Classes))
	return nil
}
