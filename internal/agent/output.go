package agent

import (
	"context"
	"log/slog"
	"time"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// Device kinds whose sessions receive the agent's answer.
const (
	// KindXiaozhi devices (firmware, py-xiaozhi, over WebSocket or MQTT)
	// get the reply text as one "llm" message when the answer is complete.
	KindXiaozhi = "xiaozhi"
	// KindRegister devices (the registration dialect) get the stream as
	// mcp/ai/message notifications: chunk, thought, final.
	KindRegister = "register"
)

// AIMessageMethod is the notification registration-dialect devices receive
// the model's stream with.
const AIMessageMethod = "mcp/ai/message"

// AIMessage is the params of an mcp/ai/message notification.
type AIMessage struct {
	Type    string `json:"type"` // chunk, thought or final
	Content string `json:"content"`
}

// Notifier sends a JSON-RPC notification to a device on its live session
// (the registration dialect's devices). The transport that holds the device
// implements it; an offline device is an error.
type Notifier interface {
	Notify(ctx context.Context, deviceID, method string, params any) error
}

// LLMSender sends a XiaoZhi device a server "llm" message on its live
// session. The transport fills in the session id.
type LLMSender interface {
	SendLLM(ctx context.Context, deviceID string, msg xiaozhi.LLM) error
}

// deviceOutputTimeout bounds each message to the device: a device that does
// not read must not hold up the caller's stream.
const deviceOutputTimeout = 5 * time.Second

// deviceOutput forwards a chat's stream to the device it is about. It is
// used by one goroutine (the chat's emitter, which is serialised).
type deviceOutput struct {
	log      *slog.Logger
	deviceID string
	kind     string
	notifier Notifier
	sender   LLMSender
	failed   bool // after one failure the device gets nothing more of this chat
}

func (o *deviceOutput) notify(ctx context.Context, typ, content string) {
	if o.failed || o.kind != KindRegister || o.notifier == nil || content == "" && typ != "final" {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deviceOutputTimeout)
	defer cancel()
	if err := o.notifier.Notify(ctx, o.deviceID, AIMessageMethod, AIMessage{Type: typ, Content: content}); err != nil {
		o.failed = true
		o.log.Debug("could not stream the answer to the device", "error", err)
	}
}

// final sends the complete answer: a final notification, or an llm message.
func (o *deviceOutput) final(ctx context.Context, text string) {
	switch o.kind {
	case KindRegister:
		o.notify(ctx, "final", text)
	case KindXiaozhi:
		if o.sender == nil || text == "" {
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deviceOutputTimeout)
		defer cancel()
		if err := o.sender.SendLLM(ctx, o.deviceID, xiaozhi.LLM{Type: xiaozhi.TypeLLM, Text: text, Emotion: "neutral"}); err != nil {
			o.log.Debug("could not send the answer to the device", "error", err)
		}
	}
}
