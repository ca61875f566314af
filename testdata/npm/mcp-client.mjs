// A standard MCP client nobody at mcpgate wrote: the official TypeScript SDK
// over Streamable HTTP. Used by internal/e2e (see scripts/test.sh).
//
//   node mcp-client.mjs URL [TOOL ARGS_JSON]...
//
// Connects to URL, lists every tool (all pages), calls each TOOL with its
// ARGS_JSON in order, and prints one JSON object on stdout:
//   {"protocolVersion", "serverInfo", "tools": [names], "calls": [{"name", "arguments", "result"}]}
// Exits non-zero (message on stderr) when anything fails. With MCP_CLIENT_PAUSE
// set, it prints "listed" and waits for a line on stdin before the calls.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, ...rest] = process.argv.slice(2);
if (!url || rest.length % 2 !== 0) {
  console.error("usage: node mcp-client.mjs URL [TOOL ARGS_JSON]...");
  process.exit(2);
}

const client = new Client({ name: "mcpgate-npm-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url));
try {
  await client.connect(transport);
  const tools = [];
  let cursor;
  do {
    const page = await client.listTools(cursor ? { cursor } : {});
    tools.push(...page.tools.map((t) => t.name));
    cursor = page.nextCursor;
  } while (cursor);
  if (process.env.MCP_CLIENT_PAUSE) {
    // The test changes something (takes a device offline) between the
    // listing and the calls: "listed" on stdout, then one line on stdin.
    console.log("listed");
    await new Promise((resolve) => process.stdin.once("data", resolve));
    process.stdin.pause();
  }
  const calls = [];
  for (let i = 0; i < rest.length; i += 2) {
    const name = rest[i];
    const args = JSON.parse(rest[i + 1]);
    const result = await client.callTool({ name, arguments: args });
    calls.push({ name, arguments: args, result });
  }
  console.log(JSON.stringify({
    protocolVersion: transport.protocolVersion,
    serverInfo: client.getServerVersion(),
    tools,
    calls,
  }));
  await transport.terminateSession().catch(() => {});
  await client.close();
} catch (err) {
  console.error("mcp-client:", err?.stack ?? err);
  process.exit(1);
}
