package mcpserver

// MetaWait is the tools/call _meta key that makes a call to a control tool of
// a registration-dialect device wait for the device's answer:
// {"_meta": {"mcpgate/wait": true}}. Without it such a call returns success
// at once, with "mcpgate/accepted": true and "mcpgate/call_id" in the
// result's _meta, and the device's real answer is published as a
// call_completed event with that call_id (docs/registration.md).
const MetaWait = "mcpgate/wait"
