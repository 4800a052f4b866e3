// Reference renderer for chat-template tests: renders JSONL records {messages,
// add_generation_prompt, extra} with @huggingface/jinja (the JS port of Jinja used by
// transformers.js) and writes "<<<record N>>>\n" + text + "\n" per record, or
// "<<<record N error>>>\n" when the template raises -- the format of `moetrain chat-render`.
// Usage: node render_chat_template.js <template.jinja | tokenizer_config.json> <records.jsonl>
"use strict";
const fs = require("fs");
const path = require("path");
const { Template } = require(path.join(__dirname, "node_modules/@huggingface/jinja"));

function loadTemplate(file) {
  const text = fs.readFileSync(file, "utf8");
  let cfg = null;
  try {
    cfg = JSON.parse(text);
  } catch (e) {
    cfg = null;
  }
  if (!cfg || typeof cfg !== "object" || !("chat_template" in cfg)) return { source: text, specials: {} };
  let source = cfg.chat_template;
  if (Array.isArray(source)) source = source.find((e) => e.name === "default").template;
  const specials = {};
  for (const k of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
    const v = cfg[k];
    if (typeof v === "string") specials[k] = v;
    else if (v && typeof v === "object" && typeof v.content === "string") specials[k] = v.content;
  }
  return { source, specials };
}

function main() {
  const [tmplFile, inputFile] = process.argv.slice(2);
  if (!tmplFile || !inputFile) {
    process.stderr.write("usage: node render_chat_template.js <template> <records.jsonl>\n");
    process.exit(2);
  }
  const { source, specials } = loadTemplate(tmplFile);
  const template = new Template(source);
  const lines = fs.readFileSync(inputFile, "utf8").split("\n");
  let out = "";
  let record = 0;
  for (const line of lines) {
    if (line.trim() === "") continue;
    const rec = JSON.parse(line);
    const vars = { ...specials, ...(rec.extra || {}) };
    if (!("tools" in vars)) vars.tools = null;
    if (!("documents" in vars)) vars.documents = null;
    vars.messages = rec.messages;
    vars.add_generation_prompt = !!rec.add_generation_prompt;
    try {
      out += `<<<record ${record}>>>\n` + template.render(vars) + "\n";
    } catch (e) {
      out += `<<<record ${record} error>>>\n`;
      process.stderr.write(`record ${record}: ${e.message}\n`);
    }
    ++record;
  }
  process.stdout.write(out);
}

main();
