"""GET /api/v2/docs: a self-contained page that renders /api/v2/openapi.json.

No CDN and no framework: a little script fetches the document and lists every
path, its operations, parameters, request body and responses, with schema
references linked to the components section below them.
"""

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>PAI REST API</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:15px/1.45 system-ui,sans-serif;margin:0 auto;max-width:70rem;padding:1rem 2rem;color:#1b1f24}
h1{margin-bottom:.2rem} .op{border:1px solid #d0d7de;border-radius:6px;margin:.6rem 0;padding:.5rem .8rem}
.m{display:inline-block;min-width:4.2rem;font-weight:700;text-transform:uppercase}
.get{color:#0969da}.post{color:#1a7f37}.put{color:#9a6700}.delete{color:#cf222e}
code,pre{font:13px ui-monospace,monospace;background:#f6f8fa;border-radius:4px;padding:0 .25rem}
pre{padding:.5rem;overflow:auto} table{border-collapse:collapse;margin:.3rem 0} td,th{border:1px solid #d0d7de;padding:.15rem .5rem;text-align:left;vertical-align:top}
.pub{font-size:12px;color:#57606a;border:1px solid #d0d7de;border-radius:9px;padding:0 .4rem;margin-left:.4rem}
details>summary{cursor:pointer}
</style></head><body>
<h1 id="title">PAI REST API</h1><p id="desc">Loading <a href="/api/v2/openapi.json">/api/v2/openapi.json</a>...</p>
<nav id="toc"></nav><main id="paths"></main><h2 id="schemas-title">Schemas</h2><main id="schemas"></main>
<script>
function el(tag, attrs, ...kids){const e=document.createElement(tag);for(const [k,v] of Object.entries(attrs||{}))e.setAttribute(k,v);
  for(const k of kids){e.append(k instanceof Node?k:document.createTextNode(String(k)))}return e}
function typeOf(s){if(!s)return "any";if(s.$ref){const n=s.$ref.split("/").pop();return el("a",{href:"#schema-"+n},n)}
  if(s.oneOf||s.anyOf){const f=el("span");(s.oneOf||s.anyOf).forEach((x,i)=>{if(i)f.append(" | ");f.append(typeOf(x))});return f}
  if(s.type==="array"){const f=el("span",{},"array of ");f.append(typeOf(s.items));return f}
  let t=Array.isArray(s.type)?s.type.join(" | "):(s.type||"any");if(s.enum)t+=" ("+s.enum.join(", ")+")";return t}
function schemaTable(s){if(!s||!s.properties)return el("div",{},typeOf(s));const req=new Set(s.required||[]);
  const t=el("table",{},el("tr",{},el("th",{},"field"),el("th",{},"type"),el("th",{},"")));
  for(const [k,v] of Object.entries(s.properties)){t.append(el("tr",{},el("td",{},el("code",{},k)),el("td",{},typeOf(v)),el("td",{},(req.has(k)?"required. ":"")+(v.description||""))))}return t}
fetch("/api/v2/openapi.json").then(r=>r.json()).then(doc=>{
  document.getElementById("title").textContent=doc.info.title+" "+doc.info.version;
  document.getElementById("desc").textContent=doc.info.description||"";
  const main=document.getElementById("paths"), toc=document.getElementById("toc");
  for(const [path,item] of Object.entries(doc.paths)){for(const [method,op] of Object.entries(item)){
    const id=(method+path).replace(/[^a-zA-Z0-9]+/g,"-");
    toc.append(el("div",{},el("a",{href:"#"+id},el("span",{class:"m "+method},method)," "+path)));
    const box=el("section",{class:"op",id:id},el("h3",{},el("span",{class:"m "+method},method)," ",el("code",{},path)));
    if(op.security&&op.security.length===0)box.querySelector("h3").append(el("span",{class:"pub"},"public"));
    box.append(el("p",{},op.summary||""));if(op.description)box.append(el("p",{},op.description));
    if(op.parameters){const t=el("table",{},el("tr",{},el("th",{},"parameter"),el("th",{},"in"),el("th",{},"type"),el("th",{},"")));
      op.parameters.forEach(p=>t.append(el("tr",{},el("td",{},el("code",{},p.name)),el("td",{},p.in),el("td",{},typeOf(p.schema)),el("td",{},(p.required?"required. ":"")+(p.description||"")))));box.append(t)}
    if(op.requestBody){const d=el("div",{},el("b",{},"body: "));for(const [ct,m] of Object.entries(op.requestBody.content)){d.append(el("code",{},ct)," ",typeOf(m.schema),"  ")}box.append(d)}
    const rs=el("table",{},el("tr",{},el("th",{},"status"),el("th",{},"meaning"),el("th",{},"body")));
    for(const [st,r] of Object.entries(op.responses||{})){const c=r.content?Object.values(r.content)[0]:null;rs.append(el("tr",{},el("td",{},st),el("td",{},r.description||""),el("td",{},c?typeOf(c.schema):"")))}
    box.append(rs);main.append(box)}}
  const sc=document.getElementById("schemas");
  for(const [name,s] of Object.entries((doc.components||{}).schemas||{})){
    const d=el("details",{id:"schema-"+name},el("summary",{},el("code",{},name)," ",s.description||""));d.append(schemaTable(s));sc.append(d)}
}).catch(e=>{document.getElementById("desc").textContent="could not load the API document: "+e});
</script></body></html>
"""
