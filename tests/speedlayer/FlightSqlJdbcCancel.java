// Gives up on a long query through the Arrow Flight SQL JDBC driver, for
// tests/speedlayer/test_flight_sql_jdbc.py:
// java -cp flight-sql-jdbc-driver.jar FlightSqlJdbcCancel.java <jdbc url> <user> <password> cancel|timeout <sql>
// cancel: Statement.cancel() from another thread once the statement's result set has queued the
// answer's stream (the driver then waits for it, and cancel() closes it); timeout: setQueryTimeout(1)
// (the driver times the wait for the answer's stream), then close the statement when it fails.
// Prints FAILED and the driver's error (or ANSWERED), and GAVE_UP with System.nanoTime()
// (CLOCK_MONOTONIC on Linux, the clock the worker reports on) when it cancelled, or when its
// timeout surfaced.
import java.lang.reflect.Field;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Collection;
import java.util.Properties;

public class FlightSqlJdbcCancel {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        properties.setProperty("user", args[1]);
        properties.setProperty("password", args[2]);
        String sql = args[4];
        try (Connection connection = DriverManager.getConnection(args[0], properties);
             Statement statement = connection.createStatement()) {
            if (args[3].equals("timeout")) {
                statement.setQueryTimeout(1);
                execute(statement, sql);  // fails when the driver's timer (on the answer's stream) runs out
                System.out.println("GAVE_UP\t" + System.nanoTime());
                return;  // closing the statement closes the answer's stream
            }
            Thread runner = new Thread(() -> execute(statement, sql));
            runner.start();
            long deadline = System.nanoTime() + 60_000_000_000L;
            while (!streamQueued(statement) && runner.isAlive() && System.nanoTime() < deadline) {
                Thread.sleep(10);
            }
            if (!streamQueued(statement)) {  // the statement ended (or never reached its stream) unasked
                System.out.println("NOT_QUEUED");
                runner.join(60_000);
                return;
            }
            // A person cancels a query seconds into it; cancelled within milliseconds of its stream
            // being queued, the DoGet may not have reached the gateway yet, and a call cancelled
            // before its handler runs leaves the answer it was to wait for unwatched (measured: the
            // worker then ran to its deadline, 1 run in 3 at load 18). Half a second leaves it time.
            Thread.sleep(500);
            System.out.println("GAVE_UP\t" + System.nanoTime());
            statement.cancel();
            runner.join(60_000);
        }
    }

    // Whether the statement's result set has queued the answer's stream (the driver's private
    // FlightEndpointDataQueue holds its future). A cancel() before that leaves the stream open
    // until the connection closes (driver 18.3.0: the queue is closed before the stream enters
    // it), so the test cancels after it, as a user cancelling a query that is running would.
    private static boolean streamQueued(Statement statement) throws Exception {
        Object resultSet = statement.getResultSet();
        if (resultSet == null) {
            return false;
        }
        Field queueField = resultSet.getClass().getDeclaredField("flightEndpointDataQueue");
        queueField.setAccessible(true);
        Object queue = queueField.get(resultSet);
        if (queue == null) {
            return false;
        }
        Field futures = queue.getClass().getDeclaredField("futures");
        futures.setAccessible(true);
        return !((Collection<?>) futures.get(queue)).isEmpty();
    }

    private static void execute(Statement statement, String sql) {
        try {
            statement.executeQuery(sql).close();
            System.out.println("ANSWERED");
        } catch (SQLException e) {
            System.out.println("FAILED\t" + String.valueOf(e.getMessage()).split("\n")[0]);
        }
    }
}
