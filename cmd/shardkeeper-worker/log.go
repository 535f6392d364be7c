package main

import (
	"io"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newLogger returns the worker's logger: JSON lines through zap and zapr,
// encoded as the operator's controller-runtime zap logger encodes them
// (zap's production encoder, RFC 3339 times, a stack trace with errors),
// so one log pipeline parses both. pkg/worker adds the keys the operator
// uses too: topology (namespace/name), member, unit, epoch. -v N enables
// V(N) lines.
func newLogger(w io.Writer, verbosity int) logr.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.RFC3339TimeEncoder
	sink := zapcore.AddSync(w)
	core := zapcore.NewCore(zapcore.NewJSONEncoder(enc), sink, zap.NewAtomicLevelAt(zapcore.Level(-verbosity)))
	return zapr.NewLogger(zap.New(core, zap.AddStacktrace(zapcore.ErrorLevel), zap.ErrorOutput(sink)))
}
