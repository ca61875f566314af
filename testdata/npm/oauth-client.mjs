// An OAuth-first MCP client, as mcp-remote and the MCP Inspector are: the
// official TypeScript SDK's Streamable HTTP transport with an OAuth provider
// that would register dynamically and open a browser. Used by internal/e2e.
//
//   node oauth-client.mjs URL [--no-provider | --complete]
//
// Connects to URL without credentials and prints one JSON object on stdout:
//   {"connected", "error", "requests": ["METHOD /path"], "redirected"}
// "redirected" is whether the SDK got as far as sending the user to an
// authorization page. Exits non-zero only on a usage error.
//
// With --complete it goes through the whole flow, the test playing the
// user: it prints {"authorize": URL} (the page the user would be sent to),
// reads the authorization code from a line of stdin, finishes the
// authorization (the token exchange), connects again with the token and
// lists tools, then prints the object above with "tools" (their count).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, flag] = process.argv.slice(2);
if (!url) {
  console.error("usage: node oauth-client.mjs URL [--no-provider]");
  process.exit(2);
}

const requests = [];
const recordingFetch = async (input, init) => {
  const u = new URL(input instanceof Request ? input.url : input);
  requests.push(`${init?.method ?? "GET"} ${u.pathname}`);
  return fetch(input, init);
};

let redirected = false;
let authorizeURL = "";
let clientInformation;
let tokens;
let verifier = "";
const provider = {
  get redirectUrl() { return "http://127.0.0.1:1/oauth/callback"; },
  get clientMetadata() {
    return { client_name: "oauth-first test client", redirect_uris: ["http://127.0.0.1:1/oauth/callback"] };
  },
  clientInformation: () => clientInformation,
  saveClientInformation: (info) => { clientInformation = info; },
  tokens: () => tokens,
  saveTokens: (t) => { tokens = t; },
  redirectToAuthorization: (u) => { redirected = true; authorizeURL = String(u); },
  saveCodeVerifier: (v) => { verifier = v; },
  codeVerifier: () => verifier,
};

if (flag === "--complete") {
  let connected = false;
  let error = "";
  let tools = 0;
  try {
    try {
      await new Client({ name: "mcpgate-oauth-test", version: "1.0.0" }).connect(
        new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: recordingFetch }));
    } catch (err) {
      if (!redirected) throw err; // anything but "go and authorize"
    }
    console.log(JSON.stringify({ authorize: authorizeURL }));
    const code = await new Promise((resolve) => {
      let buf = "";
      process.stdin.on("data", (d) => {
        buf += d;
        if (buf.includes("\n")) resolve(buf.trim());
      });
    });
    const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: recordingFetch });
    await transport.finishAuth(code);
    const client = new Client({ name: "mcpgate-oauth-test", version: "1.0.0" });
    await client.connect(transport);
    connected = true;
    tools = (await client.listTools()).tools.length;
    await client.close();
  } catch (err) {
    error = String(err?.message ?? err);
  }
  console.log(JSON.stringify({ connected, error, requests, redirected, tools }));
  process.exit(0);
}

const client = new Client({ name: "mcpgate-oauth-test", version: "1.0.0" });
const transport = new StreamableHTTPClientTransport(new URL(url), {
  authProvider: flag === "--no-provider" ? undefined : provider,
  fetch: recordingFetch,
});
let connected = false;
let error = "";
try {
  await client.connect(transport);
  connected = true;
  await client.close();
} catch (err) {
  error = String(err?.message ?? err);
}
console.log(JSON.stringify({ connected, error, requests, redirected }));
