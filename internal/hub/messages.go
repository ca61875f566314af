package hub

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/mcpgate/mcpgate/xiaozhi"
)

// SendLLM sends a XiaoZhi device the server's "llm" message (the reply text
// and an emotion) on its live connection, in the connection's session. It
// fails with ErrDeviceNotFound or ErrDeviceOffline, with
// mcpclient.ErrNoMessages for a device whose connection carries MCP only
// (an endpoint source, a registration-dialect device), or when the write
// fails.
func (h *Hub) SendLLM(ctx context.Context, ref string, msg xiaozhi.LLM) error {
	h.mu.RLock()
	d, err := h.lookupLocked(ref)
	var att *Attachment
	var sid string
	if err == nil {
		// The device's session id now, which may have changed since Attach
		// (Attachment.SetSessionID).
		att, sid = d.att, d.sessionID
	}
	h.mu.RUnlock()
	if err != nil {
		return err
	}
	if att == nil {
		return fmt.Errorf("%w: %s", ErrDeviceOffline, d.id)
	}
	msg.Type = xiaozhi.TypeLLM
	msg.SessionID = sid
	b, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode llm message: %w", err)
	}
	if err := att.sess.SendMessage(ctx, b); err != nil {
		return fmt.Errorf("send llm message to %s: %w", d.id, err)
	}
	return nil
}
