// The job page's SSH box: for a running job with the ssh plugin, each task's command
// line (GET /api/v2/jobs/{id}/ssh), copyable, and the job's private key to save beside it
// (the command names it with -i). Jobs without the plugin answer 404: no box.

import { get, jobPath } from "../api.js";
import { announce, clear, h } from "../dom.js";

async function copy(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "Copied";
    announce("SSH command copied");
  } catch {  // no clipboard (an insecure origin): select it, for Ctrl+C
    const code = button.previousElementSibling;
    const range = document.createRange();
    range.selectNodeContents(code);
    getSelection().removeAllRanges();
    getSelection().addRange(range);
  }
}

function saveKey(pair) {
  const url = URL.createObjectURL(new Blob([pair.privateKey], { type: "application/octet-stream" }));
  const a = h("a", { href: url, download: pair.privateKeyFileName });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export function sshSection(id) {
  const box = h("div");
  const section = h("section", { id: "ssh", "aria-labelledby": "ssh-title", hidden: true },
    h("h2", { id: "ssh-title" }, "SSH"), box);
  let shown = "";

  async function update(state) {
    if (state !== "RUNNING") { section.hidden = true; return; }
    let info;
    try { info = await get(`${jobPath(id)}/ssh`); } catch (err) {
      section.hidden = err.status === 404;  // no task runs an SSH server (or not yet)
      if (err.status !== 404) clear(box, h("p", { class: "muted" }, err.message));
      return;
    }
    const key = JSON.stringify(info);
    section.hidden = false;
    if (key === shown) return;  // a re-read with nothing new leaves a selection alone
    shown = key;
    const pair = info.keyPair;
    clear(box,
      h("ul", { class: "ssh-lines" }, info.containers.filter((c) => c.sshCommand).map((c) => {
        const button = h("button", { type: "button", class: "small", "aria-label": `copy the SSH command of ${c.taskRoleName}[${c.taskIndex}]` }, "Copy");
        button.addEventListener("click", () => copy(c.sshCommand, button));
        return h("li", { dataset: { task: `${c.taskRoleName}-${c.taskIndex}` } },
          h("span", { class: "muted" }, `${c.taskRoleName}[${c.taskIndex}] `), h("code", { class: "ssh-command" }, c.sshCommand), " ", button);
      })),
      pair && pair.privateKey
        ? h("p", {}, h("button", { type: "button", id: "ssh-key-save", onclick: () => saveKey(pair) }, `Save the job's key (${pair.privateKeyFileName})`),
          h("span", { class: "muted" }, ` then chmod 600 ${pair.privateKeyFileName}; or run `, h("code", {}, `pai ssh ${id}`), "."))
        : h("p", { class: "muted" }, "Your profile's SSH keys are accepted too (", h("a", { href: "#/profile" }, "your SSH keys"), ")."));
  }

  return { section, update };
}
