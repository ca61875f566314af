// The official TypeScript SDK's check of a tool result's structuredContent
// against its outputSchema, for internal/hub's format tests (see
// scripts/test.sh).
//
//   node check-formats.mjs < cases.json
//
// Reads a JSON array of {"format", "value"} on stdin and prints a JSON array
// of booleans on stdout: whether the SDK client's default validator (Ajv with
// ajv-formats) accepts {"v": value} under
// {"type": "object", "properties": {"v": {"format": format}}}.
import { AjvJsonSchemaValidator } from "@modelcontextprotocol/sdk/validation/ajv";

let input = "";
for await (const chunk of process.stdin) input += chunk;
const validator = new AjvJsonSchemaValidator();
const valid = JSON.parse(input).map(({ format, value }) =>
  validator.getValidator({ type: "object", properties: { v: { format } } })({ v: value }).valid,
);
console.log(JSON.stringify(valid));
