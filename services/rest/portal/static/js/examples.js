// Starting points for the submit page (OpenPAI protocol v2).

export const EXAMPLES = {
  hello: `protocolVersion: 2
name: hello
type: job
jobRetryCount: 0
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - echo "hello from PAI on $(hostname)"
defaults:
  virtualCluster: default
`,
  parameters: `protocolVersion: 2
name: train-with-parameters
type: job
parameters:
  epochs: "3"
  lr: "0.01"
taskRoles:
  trainer:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 512, gpu: 0}
    commands:
      - for e in $(seq <% $parameters.epochs %>); do echo "epoch $e lr=<% $parameters.lr %>"; sleep 1; done
defaults:
  virtualCluster: default
`,
  distributed: `protocolVersion: 2
name: two-roles
type: job
taskRoles:
  server:
    instances: 1
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - echo "server on $PAI_HOST_IP_server_0"; sleep 5
  worker:
    instances: 2
    resourcePerInstance: {cpu: 1, memoryMB: 256, gpu: 0}
    commands:
      - echo "worker $PAI_CURRENT_TASK_ROLE_CURRENT_TASK_INDEX of $PAI_TASK_ROLE_TASK_COUNT_worker"; sleep 3
defaults:
  virtualCluster: default
`,
};
