// Drives OpenPAI's own JavaScript SDK (@microsoft/openpai-js-sdk, pinned in package.json)
// through PAI's REST API: users, groups, tokens, VCs, a job's whole life, its attempts,
// task logs, tags, events and the Kubernetes views. Run by
// tests/integration/test_openpai_sdk.py with PAI_URL, PAI_TOKEN (an admin's) and RUN set;
// prints one JSON object of what it saw, or the step that failed and why (exit 1).
'use strict';

const axios = require('axios');
const { PAIV2 } = require('@microsoft/openpai-js-sdk');

const URL_ = process.env.PAI_URL;
const RUN = process.env.RUN;
const seen = {};
let step = 'start';

function client(extra) {
  return new PAIV2.OpenPAIClient({ rest_server_uri: URL_, https: false, ...extra });
}

async function until(what, check, seconds) {
  const deadline = Date.now() + seconds * 1000;
  let last;
  while (Date.now() < deadline) {
    last = await check();
    if (last.done) return last.value;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`${what}: not within ${seconds} s (last: ${JSON.stringify(last)})`);
}

async function main() {
  const admin = client({ token: process.env.PAI_TOKEN });
  const user = `sdk${RUN}`;
  const password = 'sdk passphrase 1';
  const group = `sdkg${RUN}`;

  step = 'info'; seen.info = await admin.api.getClusterInfo();

  step = 'create user'; await admin.user.createUser({ username: user, password, admin: false, email: `${user}@example.com` });
  // Signs in with the form body OpenPAI's SDK sends (no token given).
  step = 'sign in'; const alice = client({ username: user, password });
  step = 'get user'; seen.user = await alice.user.getUser(user);
  step = 'list users'; seen.userCount = (await admin.user.getAllUser()).length;

  step = 'create group';
  await admin.group.createGroup({ groupname: group, description: 'made by the SDK', externalName: `cn=${group}`,
    extension: { acls: { virtualClusters: ['default'], storageConfigs: [process.env.STORAGE] } } });
  step = 'update group'; await admin.group.updateGroup({ data: { groupname: group, description: 'changed by the SDK' }, patch: true });
  step = 'get group'; seen.group = await admin.group.getGroup(group);
  step = 'add to group'; await admin.user.updateUserGroup(user, group);
  step = 'members'; seen.members = await admin.group.getGroupMembers(group);
  step = 'remove from group'; await admin.user.deleteUserGroup(user, group);
  step = 'after removal'; seen.afterRemoval = (await admin.user.getUser(user)).grouplist;
  step = 'grouplist'; await admin.user.updateUserGrouplist(user, ['default', group]);
  step = 'update user'; await admin.user.updateUser({ username: user, email: `changed${RUN}@example.com` });
  step = 'update self'; await alice.user.updateUserSelf({ username: user, extension: { editor: 'vscode' } });
  step = 'user after'; seen.userAfter = await admin.user.getUser(user);

  step = 'application token'; const made = await alice.token.createApplicationToken();
  seen.applicationToken = { application: made.application, works: false };
  step = 'use application token';
  seen.applicationToken.works = (await client({ token: made.token }).user.getUser(user)).username === user;
  step = 'list tokens'; seen.tokenCount = (await alice.token.getTokens()).tokens.length;
  step = 'revoke token'; await alice.token.deleteToken(made.token);
  step = 'revoked token refused';
  try { await client({ token: made.token }).user.getUser(user); seen.revokedRefused = false; } catch (e) { seen.revokedRefused = true; }

  step = 'VCs'; seen.vcs = Object.keys(await alice.virtualCluster.listVirtualClusters());
  step = 'VC'; seen.vc = await alice.virtualCluster.getVirtualCluster('default');
  step = 'VC sku types'; seen.vcSkus = await alice.virtualCluster.getVirtualClusterSkuTypes('default');

  const role = (commands) => ({ instances: 1, resourcePerInstance: { cpu: 1, memoryMB: 256, gpu: 0 }, commands });
  const job = `hello${RUN}`;
  step = 'submit'; await alice.job.createJob({ protocolVersion: 2, name: job, type: 'job', jobRetryCount: 0,
    taskRoles: { main: role([`echo hello-from-the-sdk-${RUN}`]) }, defaults: { virtualCluster: 'default' } });
  step = 'job succeeds';
  seen.job = await until('the job to succeed', async () => {
    const got = await alice.job.getJob(user, job);
    return { done: ['SUCCEEDED', 'FAILED', 'STOPPED'].includes(got.jobStatus.state), value: got };
  }, 60);
  step = 'list jobs'; seen.listed = (await alice.job.listJobs({ username: user })).map((j) => j.name);
  step = 'config'; seen.config = await alice.job.getJobConfig(user, job);
  step = 'tag'; await alice.job.addTag(user, job, 'sdk');
  step = 'tags'; seen.tags = (await alice.job.getJob(user, job)).tags;
  step = 'untag'; await alice.job.deleteTag(user, job, 'sdk');
  step = 'tags after'; seen.tagsAfter = (await alice.job.getJob(user, job)).tags;
  step = 'events'; seen.events = (await alice.job.listEvents(user, job)).data.map((e) => e.reason);
  step = 'history healthz'; seen.healthz = await alice.jobHistory.getJobAttemptsHealthz(user, job);
  step = 'attempts'; seen.attempts = (await alice.jobHistory.getJobAttempts(user, job)).map((a) => a.attemptIndex);
  step = 'attempt 0'; const attempt = await alice.jobHistory.getJobAttempt(user, job, 0);
  seen.attempt0 = { attemptIndex: attempt.attemptIndex, state: attempt.state, roles: Object.keys(attempt.taskRoles) };
  step = 'job at attempt 0'; seen.jobAt0 = (await alice.job.getJob(user, job, 0)).jobStatus.state;
  step = 'task'; const task = await alice.job.getTask(user, job, 0, 'main', 0);
  seen.task = { state: task.taskState, attempts: task.attempts.map((a) => a.attemptId) };
  step = 'task logs';
  const logs = await alice.job.getTaskLogs(user, job, 0, 'main', 0, task.attempts[task.attempts.length - 1].attemptId);
  seen.logNames = logs.locations.map((l) => l.name);
  step = 'read log';
  seen.log = (await axios.get(logs.locations[0].uri, { headers: { Authorization: `Bearer ${await alice.getToken()}` },
    responseType: 'text' })).data;

  // A job stopped while it runs; the Kubernetes views show its task as a Pod meanwhile.
  const sleeper = `sleeper${RUN}`;
  step = 'submit sleeper'; await alice.job.createJob({ protocolVersion: 2, name: sleeper, type: 'job',
    taskRoles: { main: role(['sleep 300']) }, defaults: { virtualCluster: 'default' } });
  step = 'sleeper runs';
  await until('the sleeper to run', async () => ({ done: (await alice.job.getJob(user, sleeper)).jobStatus.state === 'RUNNING' }), 60);
  step = 'k8s nodes'; const nodes = await admin.kubernetes.getK8sNodes();
  seen.nodes = { kind: nodes.kind, names: nodes.items.map((n) => n.metadata.name) };
  step = 'k8s pods'; const pods = await admin.kubernetes.getK8sPods();
  seen.pods = { kind: pods.kind, jobs: pods.items.map((p) => p.metadata.labels.jobName) };
  step = 'k8s refused to a user';
  try { await alice.kubernetes.getK8sNodes(); seen.nodesRefused = false; } catch (e) { seen.nodesRefused = true; }
  step = 'stop'; await alice.job.updateJobExecutionType(user, sleeper, 'STOP');
  step = 'sleeper stops';
  seen.stopped = await until('the sleeper to stop', async () => {
    const state = (await alice.job.getJob(user, sleeper)).jobStatus.state;
    return { done: state === 'STOPPED', value: state };
  }, 60);

  step = 'storages';
  seen.storages = await alice.storage.getStorages();
  step = 'storage'; seen.storage = await alice.storage.getStorage(process.env.STORAGE);

  step = 'sign out'; await alice.authn.basicLogout();
  step = 'delete user'; await admin.user.deleteUser(user);
  step = 'delete group'; await admin.group.deleteGroup(group);
  step = 'done';
}

main().then(() => {
  process.stdout.write(JSON.stringify(seen));
}).catch((err) => {
  const detail = err && err.response ? { status: err.response.status, data: err.response.data } : undefined;
  process.stdout.write(JSON.stringify({ failedAt: step, error: String(err && err.message || err), detail, seen }));
  process.exit(1);
});
