package org.sparkcep.shim;

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

import org.apache.spark.SparkConf;
import org.apache.spark.api.plugin.DriverPlugin;
import org.apache.spark.api.plugin.ExecutorPlugin;
import org.apache.spark.api.plugin.PluginContext;
import org.apache.spark.api.plugin.SparkPlugin;

/**
 * Starts the sparkcep instance managers of each Spark executor, and stops them with it.
 *
 * <p>Enable with {@code spark.plugins=org.sparkcep.shim.SparkcepPlugin} and the jar on
 * {@code spark.jars} ({@code sparkcep.spark.configure(builder)} sets both). On executor start,
 * {@link ExecutorSide#init} runs {@code <python> -m sparkcep.spark.executor} (the launcher), which
 * starts the instance managers pinned to cores, registers them with the engine, prints one line
 * {@code READY <json>} and then waits on its standard input. {@link ExecutorSide#shutdown} closes
 * that input: the launcher stops and deregisters its instance managers and exits. If the JVM dies
 * without a shutdown, the pipe closes all the same.
 *
 * <p>Configuration: {@code spark.sparkcep.python} (default: PYSPARK_PYTHON or python3),
 * {@code spark.sparkcep.instanceManagers} (default: the executor's cores),
 * {@code spark.sparkcep.engine} (default: the local engine), {@code spark.sparkcep.startTimeoutMs}
 * (default 60000). In local mode the driver hosts the executor: executor id "driver".
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
    private Process launcher;
    private OutputStream control;

    @Override
    public void init(PluginContext ctx, Map<String, String> extraConf) {
      SparkConf conf = ctx.conf();
      String python = conf.get("spark.sparkcep.python",
          System.getenv().getOrDefault("PYSPARK_PYTHON", "python3"));
      String cores = conf.get("spark.executor.cores", "");
      String count = conf.get("spark.sparkcep.instanceManagers", cores);
      List<String> cmd = new ArrayList<>();
      cmd.add(python);
      cmd.add("-m");
      cmd.add("sparkcep.spark.executor");
      cmd.add("--executor-id");
      cmd.add(ctx.executorID());
      cmd.add("--host");
      cmd.add(ctx.hostname());
      if (!count.isEmpty()) {
        cmd.add("--instance-managers");
        cmd.add(count);
      }
      String engine = conf.get("spark.sparkcep.engine", "");
      if (!engine.isEmpty()) {
        cmd.add("--engine");
        cmd.add(engine);
      }
      long timeoutMs = conf.getLong("spark.sparkcep.startTimeoutMs", 60000L);
      ProcessBuilder pb = new ProcessBuilder(cmd);
      pb.redirectError(ProcessBuilder.Redirect.INHERIT);
      try {
        launcher = pb.start();
      } catch (IOException e) {
        throw new RuntimeException("sparkcep: cannot start the instance-manager launcher " + cmd
            + ": " + e.getMessage() + " (set spark.sparkcep.python to a Python with sparkcep installed)", e);
      }
      control = launcher.getOutputStream();
      String ready = awaitReady(launcher, timeoutMs);
      if (ready == null) {
        stopLauncher();
        throw new RuntimeException("sparkcep: the instance-manager launcher " + cmd
            + " did not report READY within " + timeoutMs + " ms; its errors are in the executor's stderr");
      }
      System.err.println("sparkcep: executor " + ctx.executorID() + " instance managers: " + ready);
    }

    @Override
    public void shutdown() {
      stopLauncher();
    }

    private void stopLauncher() {
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

    /** The JSON after "READY " on the launcher's stdout, or null if it exits or times out first. */
    private static String awaitReady(Process p, long timeoutMs) {
      final String[] line = new String[1];
      Thread reader = new Thread(() -> {
        try (BufferedReader r = new BufferedReader(
            new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
          String s;
          while ((s = r.readLine()) != null) {
            if (s.startsWith("READY ")) {
              synchronized (line) {
                line[0] = s.substring(6);
                line.notifyAll();
              }
            } else {
              System.err.println("sparkcep launcher: " + s);
            }
          }
        } catch (IOException ignored) {
          // the launcher exited
        }
        synchronized (line) {
          line.notifyAll();
        }
      }, "sparkcep-launcher-stdout");
      reader.setDaemon(true);
      reader.start();
      long deadline = System.currentTimeMillis() + timeoutMs;
      synchronized (line) {
        while (line[0] == null && p.isAlive()) {
          long left = deadline - System.currentTimeMillis();
          if (left <= 0) {
            break;
          }
          try {
            line.wait(Math.min(left, 200));
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            break;
          }
        }
        return line[0];
      }
    }
  }
}
