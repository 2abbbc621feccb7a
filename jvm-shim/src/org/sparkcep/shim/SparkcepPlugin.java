package org.sparkcep.shim;

import java.io.IOException;
import java.io.OutputStream;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.spark.SparkConf;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Starts the sparkcep instance managers of each Spark executor, and stops them with it.
 *
 * <p>Enable with {@code spark.plugins=org.sparkcep.shim.SparkcepPlugin} and the jar on
 * {@code spark.jars} ({@code sparkcep.spark.configure(builder)} sets both). When an executor
 * starts, {@link ExecutorSide#init} runs {@code <python> -m sparkcep.spark.executor} (the
 * launcher) and returns at once: the launcher waits for an engine, starts the executor's
 * {@code sparkcep worker} processes and registers them with it. {@link ExecutorSide#shutdown}
 * closes the launcher's standard input, which stops it and its workers; if the executor JVM dies
 * without a shutdown, the pipe closes all the same.
 *
 * <p>Nothing here throws: a launcher that cannot start is logged (the executor's stderr) and the
 * executor runs on without instance managers, so a misconfiguration never turns into executors
 * dying and being replaced. The host is the launcher's business (the operating system or
 * {@code SPARK_LOCAL_IP}); {@code PluginContext.hostname()} fails in a real executor.
 *
 * <p>Configuration: {@code spark.sparkcep.python} (default: {@code spark.pyspark.python},
 * {@code PYSPARK_PYTHON} or {@code python3}, as for Spark's Python workers),
 * {@code spark.sparkcep.instanceManagers} (default: the executor's cores),
 * {@code spark.sparkcep.engine} and {@code spark.sparkcep.tokenFile} (default: the local engine),
 * or {@code spark.sparkcep.zk} (a cluster's registry, {@code zk://HOST:PORT/PATH}: the instance
 * managers join it, with the cluster's token from {@code spark.sparkcep.tokenFile}),
 * {@code spark.sparkcep.listen}: passed to the launcher (see {@code sparkcep/spark/executor.py}).
 * In local mode the driver hosts the executor: executor id "driver".
 */
public class SparkcepPlugin implements SparkPlugin {

  @Override
  public DriverPlugin driverPlugin() {
    return null;
  }

  @Override
  public ExecutorPlugin executorPlugin() {
    return new ExecutorSide();
  }

  /** The executor side: owns the launcher process. */
  public static class ExecutorSide implements ExecutorPlugin {
    private static final Logger LOG = LoggerFactory.getLogger(SparkcepPlugin.class);
    private static final Pattern LOCAL_CORES = Pattern.compile("local\\[(\\d+)");
    private Process launcher;
    private OutputStream control;

    @Override
    public void init(PluginContext ctx, Map<String, String> extraConf) {
      List<String> cmd = command(ctx.conf(), ctx.executorID());
      ProcessBuilder pb = new ProcessBuilder(cmd);
      pb.redirectOutput(ProcessBuilder.Redirect.INHERIT);
      pb.redirectError(ProcessBuilder.Redirect.INHERIT);
      try {
        launcher = pb.start();
        control = launcher.getOutputStream();
        LOG.info("sparkcep: executor {} started its instance-manager launcher (pid {}): {}",
            ctx.executorID(), launcher.pid(), cmd);
      } catch (IOException | RuntimeException e) {
        launcher = null;
        LOG.error("sparkcep: cannot start the instance-manager launcher {}: {}; this executor runs no "
            + "instance managers (set spark.sparkcep.python to a Python with sparkcep installed)",
            cmd, e.toString());
      }
    }

    @Override
    public void shutdown() {
      if (launcher == null) {
        return;
      }
      try {
        control.close();  // end of input: the launcher stops its instance managers and exits
      } catch (IOException ignored) {
        // already closed: the launcher is gone
      }
      try {
        if (!launcher.waitFor(15, TimeUnit.SECONDS)) {
          LOG.warn("sparkcep: the instance-manager launcher (pid {}) did not stop within 15 s; "
              + "terminating it", launcher.pid());
          launcher.destroy();
          if (!launcher.waitFor(5, TimeUnit.SECONDS)) {
            launcher.destroyForcibly();
          }
        }
      } catch (InterruptedException e) {
        launcher.destroyForcibly();
        Thread.currentThread().interrupt();
      }
      launcher = null;
    }

    /** The launcher's command line for this executor. */
    static List<String> command(SparkConf conf, String executorId) {
      String python = conf.get("spark.sparkcep.python", conf.get("spark.pyspark.python",
          System.getenv().getOrDefault("PYSPARK_PYTHON", "python3")));
      List<String> cmd = new ArrayList<>(Arrays.asList(python, "-m", "sparkcep.spark.executor",
          "--executor-id", executorId));
      String count = conf.get("spark.sparkcep.instanceManagers", executorCores(conf));
      add(cmd, "--instance-managers", count);
      add(cmd, "--engine", conf.get("spark.sparkcep.engine", ""));
      add(cmd, "--zk", conf.get("spark.sparkcep.zk", ""));
      add(cmd, "--token-file", conf.get("spark.sparkcep.tokenFile", ""));
      add(cmd, "--listen", conf.get("spark.sparkcep.listen", ""));
      return cmd;
    }

    /**
     * The executor's cores: the {@code --cores} its backend was started with (standalone,
     * local-cluster, YARN), else {@code spark.executor.cores}, else N of a {@code local[N]}
     * master; "" when unknown (the launcher then uses the CPUs it may run on).
     */
    static String executorCores(SparkConf conf) {
      List<String> args = ProcessHandle.current().info().arguments().map(Arrays::asList)
          .orElse(List.of());
      int at = args.indexOf("--cores");
      if (at >= 0 && at + 1 < args.size()) {
        return args.get(at + 1);
      }
      if (conf.contains("spark.executor.cores")) {
        return conf.get("spark.executor.cores");
      }
      Matcher m = LOCAL_CORES.matcher(conf.get("spark.master", ""));
      return m.lookingAt() ? m.group(1) : "";
    }

    private static void add(List<String> cmd, String flag, String value) {
      if (value != null && !value.isEmpty()) {
        cmd.add(flag);
        cmd.add(value);
      }
    }
  }
}
