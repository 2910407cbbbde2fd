// The job page's TensorBoard button: for the owner of a running job whose task runs the
// tensorboard plugin (a `tensorboard` port), it opens the job's TensorBoard, served by
// rest at /api/v2/jobs/{id}/tensorboard/ (docs/api.md). A new tab sends no bearer header,
// so the owner's token goes as the cookie rest takes on that path alone, SameSite=Strict.

import { jobPath, session } from "../api.js";
import { h } from "../dom.js";

export function runsTensorBoard(detail) {
  return Object.values(detail.taskRoles || {}).some((r) => r.taskStatuses.some((t) => t.containerPorts && t.containerPorts.tensorboard));
}

export function tensorBoardButton(id) {
  const path = `${jobPath(id)}/tensorboard/`;
  return h("a", { class: "button", id: "tensorboard", href: path, target: "_blank", rel: "noopener",
    onclick: () => {
      const secure = location.protocol === "https:" ? "; Secure" : "";
      document.cookie = `pai_tensorboard=${session.token}; Path=${path}; SameSite=Strict${secure}`;
    } }, "TensorBoard");
}
